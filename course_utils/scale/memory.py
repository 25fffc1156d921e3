"""Each rank's persistent bytes at scale, read from PyTorch's own sharded tensors (module 11).

One CPU process plays one rank of a job of any size: :func:`backend.fake_job` joins
PyTorch's fake process group (collectives move nothing), ``init_device_mesh`` builds the
PP x DP x TP mesh, :func:`course_utils.models.llama_shapes.build` makes that rank's pipeline
stage on the meta device (shapes, no storage), ``parallelize_module`` applies tensor parallelism and
``fully_shard`` (FSDP2, ZeRO-3) shards over DP. :func:`rank_state` then reads:

* **weights**: the storage behind each parameter's local shard (FSDP2 pads dim 0 up to a
  multiple of DP, so every DP rank allocates the largest shard even where its own is smaller);
* **gradients**: the same shards (FSDP2 reduce-scatters into the padded layout; the real-rank
  check in ``scale_check.py`` measures them after a backward);
* **optimizer**: what ``torch.optim.AdamW`` creates in its first ``step`` (``exp_avg`` and
  ``exp_avg_sq`` like each local shard; the step counters, one scalar per tensor on the host,
  are left out).

FSDP2 keeps fp32 parameters, fp32 gradients and two fp32 moments: 4 + 4 + 8 = 16 bytes per
parameter, the lesson's 16 bytes split differently from its 2 + 2 + 12 (bf16 weights and
gradients, fp32 master copy and moments). With ``strategy="ddp"`` nothing is sharded over DP
(replicated data parallelism). The course's own ZeRO stages are :func:`course_zero`.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from course_utils.models import llama_shapes
from course_utils.runtime import backend
from course_utils.runtime.validate import check_index, check_int, one_of
from course_utils.zero import sizes as zero_sizes

__all__ = ["STRATEGIES", "MESH_AXES", "mesh_coords", "shard_stage", "rank_state", "state_bytes",
           "course_zero", "course_formula", "stage_kinds", "representative_ranks", "job_table"]

STRATEGIES = ("ddp", "fsdp2")
MESH_AXES = ("pp", "dp", "tp")   # outermost first: TP ranks are neighbours (one node)


def mesh_coords(rank: int, tp: int, pp: int, dp: int) -> dict[str, int]:
    """``{"pp", "dp", "tp"}`` coordinates of ``rank`` on the PP x DP x TP mesh."""
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp)):
        check_int(name, value, 1)
    check_index("rank", rank, tp * pp * dp)
    return {"pp": rank // (dp * tp), "dp": rank // tp % dp, "tp": rank % tp}


def shard_stage(model: str, tp: int, pp: int, dp: int, strategy: str = "fsdp2",
                n_layers: int | None = None, mixed: bool = False,
                tp_plan: str = "per_linear", split: str = "balanced",
                reduce_dtype: str = "bf16",
                reshard_after_forward: bool = True) -> tuple[Any, Any]:
    """This rank's stage of ``model``, sharded as a real job shards it; returns (module, mesh).

    Call inside :func:`backend.fake_job` (or a real group) of ``tp * pp * dp`` ranks.
    ``mixed``: FSDP2 gathers bf16 weights and reduces bf16 gradients
    (``MixedPrecisionPolicy``), the course's communication formulas' 2-byte elements.
    ``tp_plan``: one of ``llama_shapes.TP_PLANS`` (the bytes are the same under each);
    ``split``: how the layers go to stages (``llama_shapes.SPLITS``); ``reduce_dtype``
    (``mixed`` only): ``"bf16"`` or ``"fp32"`` gradient reduction (torchtitan's default and
    Llama 3's is fp32); ``reshard_after_forward``: FSDP2's, for every layer (the root module
    keeps FSDP2's default: gathered from forward to backward).
    """
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    one_of("strategy", strategy, STRATEGIES)
    one_of("tp_plan", tp_plan, llama_shapes.TP_PLANS)    # (checked whatever tp is)
    reduce = one_of("reduce_dtype", reduce_dtype, {"bf16": torch.bfloat16,
                                                     "fp32": torch.float32})
    if dist.get_world_size() != tp * pp * dp:
        raise ValueError(f"tp x pp x dp = {tp * pp * dp} must equal the world size "
                         f"{dist.get_world_size()}")
    fake = dist.get_backend() == "fake"
    device_type = backend.SIMULATED_DEVICE if fake else backend.device().type
    mesh = init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=MESH_AXES)
    stage = mesh.get_local_rank("pp")
    on = "meta" if fake else backend.device()
    module = llama_shapes.build(model, pp=pp, stage=stage, n_layers=n_layers, device=on,
                                split=split)
    if tp > 1:
        llama_shapes.apply_tp(module, mesh["tp"], tp_plan)
    if strategy == "fsdp2":
        policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=reduce)
                  if mixed else MixedPrecisionPolicy())
        for layer in module.layers:
            fully_shard(layer, mesh=mesh["dp"], mp_policy=policy,
                        reshard_after_forward=reshard_after_forward)
        fully_shard(module, mesh=mesh["dp"], mp_policy=policy)  # (the root: kept gathered)
    return module, mesh


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _optimizer_bytes(module: torch.nn.Module, weight: dict[int, int]) -> int:
    """AdamW's state after its first step, as the optimizer creates it (moments only), each
    parameter's counted ``weight[id(p)]`` times."""
    params = [p for p in module.parameters()]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    opt = torch.optim.AdamW(params, foreach=False)
    opt.step()
    total = 0
    for p in params:
        state = opt.state[p]
        for name in ("exp_avg", "exp_avg_sq"):
            t = _local(state[name])
            total += weight[id(p)] * t.numel() * t.element_size()
    return total


def rank_state(model: str, tp: int = 1, pp: int = 1, dp: int = 1, rank: int = 0,
               strategy: str = "fsdp2", full: bool = False,
               split: str = "balanced") -> dict[str, Any]:
    """Persistent bytes of ``rank`` in a simulated ``tp x pp x dp`` job (fake process group).

    Returns ``{"weights", "grads", "optimizer", "total"}`` (bytes), ``"params"`` (elements of
    this rank's shards, unpadded), ``"padded"`` (elements it allocates), ``"coords"``,
    ``"layers"`` (this stage's layer count), ``"seconds"`` (to build, shard and count).
    The layers of a stage have the same shapes and are sharded alike (each its own FSDP2
    unit), so one is built and counted once per layer (as ``scale_comms.trace_step`` traces
    one and two); ``full``: build every layer of the stage (slow for big stages; the tests
    check that both give the same figures). ``split``: ``llama_shapes.SPLITS``.
    """
    start = time.perf_counter()
    out = backend.fake_job(rank, tp * pp * dp, _count, model, tp, pp, dp, strategy, full, split)
    out.update(coords=mesh_coords(rank, tp, pp, dp), seconds=time.perf_counter() - start)
    return out


def _count(model: str, tp: int, pp: int, dp: int, strategy: str, full: bool,
           split: str) -> dict[str, Any]:
    import torch.distributed as dist

    stage = mesh_coords(dist.get_rank(), tp, pp, dp)["pp"]
    n = len(llama_shapes.stage_layers(llama_shapes.shape(model).layers, pp, stage, split))
    module, _ = shard_stage(model, tp, pp, dp, strategy, n_layers=None if full else min(n, 1),
                            split=split)
    return state_bytes(module, layers=n)


def state_bytes(module: torch.nn.Module, layers: int | None = None) -> dict[str, Any]:
    """Persistent bytes of a sharded module on this rank (see the module docstring).
    ``layers``: the stage has that many layers like ``module.layers[0]`` (the module was built
    with one standing for them all)."""
    built = len(module.layers)
    layers = built if layers is None else layers
    if layers != built and built != 1:
        raise ValueError(f"layers={layers} needs a module built with 1 layer; it has {built}")
    one = set(map(id, module.layers[0].parameters())) if built else set()
    weight = {id(p): (layers if id(p) in one and built == 1 else 1) for p in module.parameters()}
    local = [(_local(p), weight[id(p)]) for p in module.parameters()]
    padded = sum(k * (t.untyped_storage().nbytes() // t.element_size()) for t, k in local)
    size = local[0][0].element_size()
    out = {"weights": padded * size, "grads": padded * size,
           "optimizer": _optimizer_bytes(module, weight)}
    out["total"] = out["weights"] + out["grads"] + out["optimizer"]
    out.update(params=sum(k * t.numel() for t, k in local), padded=padded, layers=layers)
    return out


def course_zero(model: str, dp: int, stage: int) -> dict[str, int]:
    """The course's own ZeRO (:func:`course_utils.zero.sizes.padded_state_bytes`, module 3):
    flat shards padded per parameter tensor, 2 + 2 + 12 bytes per parameter, for ``model`` on
    ``dp`` ranks."""
    s = llama_shapes.shape(model)
    units = [s.vocab * s.hidden] * 2 + [s.hidden]
    units += list(llama_shapes.layer_params(s).values()) * s.layers
    return zero_sizes.padded_state_bytes(units, dp, stage)


def course_formula(model: str, tp: int = 1, pp: int = 1, dp: int = 1,
                   zero_stage: int = 3) -> float:
    """The lesson's formula through module 6's playground: 16 N / (TP x PP) bytes, the
    optimizer (stage >= 1), gradients (>= 2) and weights (3) divided by DP too."""
    from course_utils.mesh import playground

    n = llama_shapes.param_count(model)
    p = playground.plan(model_params_b=n / 1e9, tp=tp, pp=pp, dp=dp, zero_stage=zero_stage)
    return p.bytes["total"]


def stage_kinds(model: str, pp: int) -> list[int]:
    """One pipeline stage of each kind: stages with the same ends and layer count hold the
    same shards, so the first of each kind stands for them all."""
    s = llama_shapes.shape(model)
    kinds: dict[tuple, int] = {}
    for stage in range(pp):
        key = (stage == 0, stage == pp - 1, len(llama_shapes.stage_layers(s.layers, pp, stage)))
        kinds.setdefault(key, stage)
    return sorted(kinds.values())


def representative_ranks(model: str, tp: int, pp: int, dp: int) -> list[int]:
    """Ranks whose bytes cover the job: the first DP and TP coordinate of each stage kind
    (:func:`stage_kinds`), and the last DP and TP coordinate of the first stage (uneven shards
    are smallest there); :func:`job_table` adds the others' last coordinates when that one
    differs."""
    ranks = [stage * dp * tp for stage in stage_kinds(model, pp)]
    last = (dp - 1) * tp + tp - 1
    return ranks + ([last] if last not in ranks else [])


def job_table(model: str, tp: int, pp: int, dp: int) -> dict[str, Any]:
    """Per-rank totals of a whole job from its representative ranks: ``{"ranks": {rank:
    bytes}, "min", "max", "formula", "seconds"}`` (formula: :func:`course_formula`, ZeRO-3)."""
    start = time.perf_counter()
    ranks = {r: rank_state(model, tp, pp, dp, r)["total"]
             for r in representative_ranks(model, tp, pp, dp)}
    last = (dp - 1) * tp + tp - 1
    if last and ranks[last] != ranks[0]:      # uneven shards: every stage's last rank too
        for stage in stage_kinds(model, pp)[1:]:
            r = stage * dp * tp + last
            ranks[r] = rank_state(model, tp, pp, dp, r)["total"]
    return {"ranks": ranks, "min": min(ranks.values()), "max": max(ranks.values()),
            "formula": course_formula(model, tp, pp, dp, 3),
            "seconds": time.perf_counter() - start}
