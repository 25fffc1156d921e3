"""Sequence parallelism against one device and against TP alone: every tensor, bytes, collectives.

:func:`compare` runs the block of :mod:`course_utils.sequence_parallel.block` in its three forms
(one device, TP, TP+SP) from several seeds on real ranks (:func:`sp_worker`), asserts every
output and gradient equal (``torch.testing.assert_close``) and returns, in an
:class:`SPComparison`, the saved bytes per rank
(:func:`course_utils.memory.activations.saved_bytes`) beside
:func:`~course_utils.sequence_parallel.saved_bytes.predicted_saved_bytes`, and the collectives
each rank issued (:func:`~course_utils.tensor_parallel.recording.record_comms`). :func:`report`
prints them as lecture 9 shows them; :func:`conjugate_worker` checks g and g-bar alone. Serves
lecture 9 (for the package of lecture 6).

Run the demo under torchrun (each rank checks TP+SP against one device)::

    torchrun --standalone --nproc-per-node 2 -m course_utils.sequence_parallel.comparison
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from course_utils.memory import activations
from course_utils.models.toy import seeded
from course_utils.runtime import backend
from course_utils.runtime.validate import check_int
from course_utils.sequence_parallel.block import (MODES, Block, SequenceParallelBlock,
                                                  TensorParallelBlock, check_block_sizes,
                                                  sync_sequence_parallel_grads)
from course_utils.sequence_parallel.saved_bytes import (BYTES_PER_ELEMENT, layernorm_part,
                                                        predicted_saved_bytes, saved_terms)
from course_utils.sequence_parallel.wire_bytes import comm_summary
from course_utils.tensor_parallel.conjugates import SEQ_DIM, gather_from_sp, reduce_scatter_to_sp
from course_utils.tensor_parallel.one_device import layer_config
from course_utils.tensor_parallel.recording import CommEvent, record_comms
from course_utils.tensor_parallel.sharding import shard_range

__all__ = ["Spec", "reference", "sp_worker", "SPComparison", "compare", "report",
           "conjugate_worker", "demo"]

Spec = Any   # "replicated" | ("cat", dim)


def _build(seed: int, c: dict) -> tuple[Block, torch.Tensor, torch.Tensor]:
    """The one-device block, its input x (B, T, C) and upstream gradient dy, from ``seed``."""
    with seeded(seed):
        block = Block(c["h"], c["ffn"], c["n_heads"])
        with torch.no_grad():  # LayerNorm starts at (1, 0): move it, so its gradients are tested
            for ln in (block.ln1, block.ln2):
                ln.weight.add_(0.1 * torch.randn_like(ln.weight))
                ln.bias.add_(0.1 * torch.randn_like(ln.bias))
    gen = torch.Generator().manual_seed(10_000 + seed)
    x = torch.randn(c["b"], c["s"], c["h"], generator=gen)    # (B, T, C)
    dy = torch.randn(c["b"], c["s"], c["h"], generator=gen)   # (B, T, C): dL/dy
    return block, x, dy


def reference(seed: int, cfg: dict | None = None) -> dict[str, torch.Tensor]:
    """Output and every gradient of the one-device :class:`Block` (loss = sum(y * dy))."""
    check_int("seed", seed, 0)
    block, x, dy = _build(seed, layer_config(cfg))
    x.requires_grad_(True)
    y = block(x)
    (y * dy).sum().backward()
    return {"y": y.detach(), "x.grad": x.grad,
            **{f"{n}.grad": p.grad for n, p in block.named_parameters()}}


def _local_grads(par: TensorParallelBlock) -> dict[str, tuple[torch.Tensor, Spec]]:
    """This rank's gradients in the one-device ``nn.Linear`` layout, with how they combine."""
    out: dict[str, tuple[torch.Tensor, Spec]] = {}
    for name in ("ln1", "ln2"):
        ln = getattr(par, name)
        out[f"{name}.weight.grad"] = (ln.weight.grad, "replicated")
        out[f"{name}.bias.grad"] = (ln.bias.grad, "replicated")
    w_parts = par.attn.qkv.weight.grad.chunk(3, dim=1)              # 3 x (C, C/t)
    b_parts = par.attn.qkv.bias.grad.chunk(3, dim=0)                # 3 x (C/t,)
    for name, w, b in zip("qkv", w_parts, b_parts):
        out[f"attn.{name}.weight.grad"] = (w.t(), ("cat", 0))       # (C/t, C) rows
        out[f"attn.{name}.bias.grad"] = (b, ("cat", 0))
    for prefix, col, row in (("attn", None, par.attn.o), ("mlp", par.mlp.up, par.mlp.down)):
        if col is not None:
            out[f"{prefix}.up.weight.grad"] = (col.weight.grad.t(), ("cat", 0))
            out[f"{prefix}.up.bias.grad"] = (col.bias.grad, ("cat", 0))
        key = "o" if prefix == "attn" else "down"
        out[f"{prefix}.{key}.weight.grad"] = (row.weight.grad.t(), ("cat", 1))
        out[f"{prefix}.{key}.bias.grad"] = (row.bias.grad, "replicated")
    return out


def sp_worker(rank: int, world_size: int, seeds: Sequence[int], cfg: dict | None = None,
              regather: bool = True) -> bytes:
    """One rank: per seed, the block as TP and as TP+SP, forward and backward.

    Returns (pickled) one dict per seed, {mode: {"results": {name: (local tensor, how it
    combines)}, "saved_bytes": bytes saved for backward, "comms": [CommEvent]}} for mode in
    :data:`MODES`. Tensors are made on :func:`course_utils.runtime.backend.device` and returned
    on CPU.
    """
    c = layer_config(cfg)
    check_block_sizes(c, world_size)
    dev = backend.device()
    tp_group = None  # the whole world is one tensor-parallel group here
    tokens = slice(*shard_range(c["s"], world_size, rank))
    out = []
    for seed in seeds:
        per_mode = {}
        for mode in MODES:
            block, x, dy = _build(seed, c)
            if mode == "tp":
                par = TensorParallelBlock(block, tp_group).to(dev)
                x_spec: Spec = "replicated"
            else:
                par = SequenceParallelBlock(block, tp_group, regather).to(dev)
                x, dy, x_spec = x[:, tokens].clone(), dy[:, tokens].clone(), ("cat", SEQ_DIM)
            x, dy = x.to(dev).requires_grad_(True), dy.to(dev)
            with record_comms() as comms:
                nbytes, y = activations.saved_bytes(lambda: par(x), exclude=par.parameters())
                (y * dy).sum().backward()
                if mode == "sp":
                    sync_sequence_parallel_grads(par)
            results = {"y": (y.detach(), x_spec), "x.grad": (x.grad, x_spec)} | _local_grads(par)
            per_mode[mode] = {
                "results": {k: (backend.to_cpu(t.detach()).contiguous().clone(), s)
                            for k, (t, s) in results.items()},
                "saved_bytes": nbytes, "comms": list(comms)}
        out.append(per_mode)
    return pickle.dumps(out)


def _assemble(name: str, parts: list[tuple[torch.Tensor, Spec]]) -> torch.Tensor:
    """The one-device tensor from the ranks' parts (replicated parts must agree)."""
    spec = parts[0][1]
    if spec == "replicated":
        for r, (t, _) in enumerate(parts[1:], 1):
            torch.testing.assert_close(t, parts[0][0], msg=lambda m, r=r: f"{name} rank {r}: {m}")
        return parts[0][0]
    return torch.cat([t for t, _ in parts], dim=spec[1])


@dataclass
class SPComparison:
    """What :func:`compare` checked and measured, per mode ("tp", "sp")."""

    tp_size: int
    seeds: tuple
    cfg: dict
    regather: bool
    names: list[str]
    equal: bool                                # every tensor assert_close to one device
    max_abs_diff: dict[str, float]
    saved_bytes: dict[str, list[int]]          # per mode, per rank (first seed); "one": 1 device
    predicted_bytes: dict[str, int]            # per mode, every rank; "one": one device
    comms: dict[str, list[CommEvent]]          # per mode, rank 0, first seed
    all_comms: dict[str, list[list[CommEvent]]] = field(default_factory=dict)  # per rank


def compare(tp_size: int, seeds: Sequence[int] = (0, 1), cfg: dict | None = None,
            regather: bool = True, timeout_s: float = 120.0, check: bool = True) -> SPComparison:
    """Run TP and TP+SP on ``tp_size`` ranks; assert_close every output and gradient to one
    device (and TP+SP to TP; ``check=False``: record instead of raising); return the
    measured and predicted bytes and the collectives."""
    check_int("tp_size", tp_size)
    seeds = tuple(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty sequence of ints >= 0; got {seeds!r}")
    for name, value in (("regather", regather), ("check", check)):
        if not isinstance(value, bool):
            raise ValueError(f"{name} must be a bool; got {value!r}")
    c = layer_config(cfg)
    check_block_sizes(c, tp_size)
    from course_utils import launch

    per_rank = [pickle.loads(b) for b in launch.run(sp_worker, tp_size, seeds, c, regather,
                                                    timeout_s=timeout_s)]
    worst = {m: 0.0 for m in MODES}
    names: list[str] = []
    failures: list[str] = []

    def close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
        try:
            torch.testing.assert_close(got, want)
        except AssertionError as err:
            failures.append(f"{what}: {err}")

    for i, seed in enumerate(seeds):
        ref = reference(seed, c)
        full = {}
        for mode in MODES:
            got = [rank_out[i][mode]["results"] for rank_out in per_rank]
            if set(got[0]) != set(ref):
                raise AssertionError(f"compared names differ: {sorted(got[0])} vs {sorted(ref)}")
            full[mode] = {n: _assemble(n, [g[n] for g in got]) for n in ref}
            for n in ref:
                close(full[mode][n], ref[n], f"seed {seed} {mode} {n} vs one device")
                worst[mode] = max(worst[mode], float((full[mode][n] - ref[n]).abs().max()))
        for n in ref:
            close(full["sp"][n], full["tp"][n], f"seed {seed} sp vs tp {n}")
        names = list(ref)
    if failures and check:
        raise AssertionError("\n".join(failures))
    sizes = dict(b=c["b"], s=c["s"], h=c["h"], ffn=c["ffn"], n_heads=c["n_heads"])
    block, x, _ = _build(seeds[0], c)
    x.requires_grad_(True)
    one, _ = activations.saved_bytes(lambda: block(x), exclude=block.parameters())
    return SPComparison(
        tp_size, seeds, c, regather, names, not failures, worst,
        {"one": [one]} | {m: [r[0][m]["saved_bytes"] for r in per_rank] for m in MODES},
        {"one": predicted_saved_bytes(**sizes)}
        | {m: predicted_saved_bytes(**sizes, tp=tp_size, mode=m, regather=regather)
           for m in MODES},
        {m: per_rank[0][0][m]["comms"] for m in MODES},
        {m: [r[0][m]["comms"] for r in per_rank] for m in MODES})


def _ops_words(ops: dict[str, int]) -> str:
    return " + ".join(f"{n} {op.replace('_', '-')}" for op, n in ops.items()) or "none"


def report(run: SPComparison) -> str:
    """A short table: saved bytes per rank (predicted, measured), collectives and ring bytes
    per phase, and whether every output and gradient equals one device. No timings."""
    if not isinstance(run, SPComparison):
        raise ValueError(f"run must be an SPComparison (from compare); got {type(run).__name__}")
    c, t = run.cfg, run.tp_size
    lines = [f"block B={c['b']} T={c['s']} C={c['h']} F={c['ffn']} heads={c['n_heads']}, "
             f"{t} gloo ranks, fp32",
             f"{'saved for backward, per rank':<30}{'predicted':>10}{'measured':>10}"
             f"{'LayerNorm part':>16}"]
    words = {"one": "one device", "tp": "TP (LayerNorm replicated)", "sp": "TP + SP"}
    for m in ("one", *MODES):
        got = sorted(set(run.saved_bytes[m]))
        shown = f"{got[0]:,}" if len(got) == 1 else "/".join(f"{g:,}" for g in got)
        terms = saved_terms(c["b"], c["s"], c["h"], c["ffn"], c["n_heads"],
                            1 if m == "one" else t, m if m in MODES else "tp", run.regather)
        ln = BYTES_PER_ELEMENT * layernorm_part(terms)
        lines.append(f"{words[m]:<30}{run.predicted_bytes[m]:>10,}{shown:>10}{ln:>16,}")
    for phase in ("forward", "backward"):
        for m in MODES:
            s = comm_summary(run.comms[m], t).get(phase, {"ops": {}, "ring_bytes": 0.0})
            lines.append(f"{phase + ' ' + m.upper():<13}{_ops_words(s['ops']):<42}"
                         f"ring sends {s['ring_bytes']:>7,.0f} B")
    lines.append(f"outputs/grads equal to one device (seeds {list(run.seeds)}): {run.equal}")
    return "\n".join(lines)


def conjugate_worker(rank: int, world_size: int, seed: int,
                     shape: tuple = (2, 4, 3)) -> bytes:
    """One rank: push rank-specific x and dy through g and g-bar (x's dim 1 is the sequence:
    this rank's slice for g, the whole length for g-bar). Returns (pickled)
    {"<op>.x", "<op>.dy", "<op>.out", "<op>.grad", "<op>.comms"} for op in g, gbar."""
    dev = backend.device()
    gen = torch.Generator().manual_seed(1000 * seed + rank)
    b, s, c = shape
    out: dict[str, Any] = {}
    for name, op, s_in, s_out in (("g", gather_from_sp, s, s * world_size),
                                  ("gbar", reduce_scatter_to_sp, s * world_size, s)):
        x = torch.randn(b, s_in, c, generator=gen).to(dev).requires_grad_(True)
        dy = torch.randn(b, s_out, c, generator=gen).to(dev)
        with record_comms() as comms:
            y = op(x)
            (y * dy).sum().backward()
        out |= {f"{name}.x": x.detach(), f"{name}.dy": dy, f"{name}.out": y.detach(),
                f"{name}.grad": x.grad, f"{name}.comms": [(e.op, e.phase) for e in comms]}
    return pickle.dumps(backend.to_cpu(out))


def demo(rank: int, world_size: int) -> float:
    """Each rank runs the TP+SP block on its tokens and checks them against one device."""
    seed, c = 0, layer_config({"s": 4 * world_size})
    check_block_sizes(c, world_size)
    block, x, dy = _build(seed, c)
    ref = reference(seed, c)
    tokens = slice(*shard_range(c["s"], world_size, rank))
    dev = backend.device()
    ref = backend.to_device(ref, dev)
    par = SequenceParallelBlock(block).to(dev)
    x = x[:, tokens].clone().to(dev).requires_grad_(True)
    y = par(x)
    (y * dy[:, tokens].to(dev)).sum().backward()
    sync_sequence_parallel_grads(par)
    torch.testing.assert_close(y.detach(), ref["y"][:, tokens])
    torch.testing.assert_close(x.grad, ref["x.grad"][:, tokens])
    torch.testing.assert_close(par.ln1.weight.grad, ref["ln1.weight.grad"])
    return math.nan if y.numel() == 0 else float((y.detach() - ref["y"][:, tokens]).abs().max())


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(demo)
