"""The all-to-all behind expert parallelism (MoE) and sequence/context parallelism (Ulysses).

Both move *activations*, not weights or gradients, with ``all_to_all``: every rank sends a
different slice to every other rank of its group (:func:`draw_all_to_all` draws one). Not every
sequence/context-parallel scheme does: ring attention passes key/value blocks point-to-point
around a ring, and Megatron's sequence parallelism uses all-gather and reduce-scatter around
the tensor-parallel regions.

* **Expert parallelism (MoE):** experts live on different ranks. A router picks one expert per
  token (top-1); an all-to-all sends each token to the rank holding its expert, the expert runs
  there, and a second all-to-all brings the result back (:func:`moe_expert_parallel`).
  The splits are uneven: they depend on how many tokens chose each rank's experts.
* **Sequence/context parallelism (DeepSpeed-Ulysses style):** each rank holds a slice of the
  sequence. Attention needs the whole sequence, so an all-to-all trades "my tokens, all heads"
  for "all tokens, my heads", attention runs per head, and a second all-to-all trades back
  (:func:`ulysses_attention`).

Each worker is checked against one device (:func:`moe_reference`, :func:`attention_reference`)
and can run over the whole world or over one axis of a :class:`course_utils.mesh.grid.Mesh`, which
is how these axes reuse the device groups of another axis (for example EP over the DP groups).
Serves lecture 6.

Run under torchrun::

    torchrun --standalone --nproc-per-node 4 -m course_utils.sequence_parallel.experts
"""

from __future__ import annotations

import functools
import math
from typing import Sequence

import torch

from course_utils.collectives.cost import ring_bytes
from course_utils.mesh.grid import Mesh, axis_group
from course_utils.runtime import backend
from course_utils.runtime.validate import check_int as _check_int

__all__ = ["make_moe", "moe_tokens", "route", "moe_reference", "moe_expert_parallel",
           "attention_inputs", "attention_reference", "ulysses_attention"]

DIM, HIDDEN = 8, 16  # token width and expert hidden width


# ------------------------------------------------------------------------------------- MoE


def make_moe(seed: int, n_experts: int, dim: int = DIM,
             hidden: int = HIDDEN) -> dict[str, torch.Tensor]:
    """Router ``[dim, E]`` and E two-layer experts: ``w1 [E, dim, hidden]``,
    ``w2 [E, hidden, dim]``."""
    _check_int("n_experts", n_experts)
    g = torch.Generator().manual_seed(seed)
    return {"router": torch.randn(dim, n_experts, generator=g),
            "w1": torch.randn(n_experts, dim, hidden, generator=g) / math.sqrt(dim),
            "w2": torch.randn(n_experts, hidden, dim, generator=g) / math.sqrt(hidden)}


def moe_tokens(seed: int, n_tokens: int, dim: int = DIM) -> torch.Tensor:
    """The global batch of tokens ``[n_tokens, dim]`` for ``seed``; rank r holds a contiguous
    slice."""
    _check_int("n_tokens", n_tokens)
    g = torch.Generator().manual_seed(10_000 + seed)
    return torch.randn(n_tokens, dim, generator=g)


def route(x: torch.Tensor, router: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-1 routing: ``(expert [T] int64, gate [T])`` = argmax and max of softmax(x @ router)."""
    probs = torch.softmax(x @ router, dim=-1)  # [T, E]
    gate, expert = probs.max(dim=-1)           # [T], [T]
    return expert, gate


def _expert(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.relu(x @ w1) @ w2  # [n, dim] -> [n, hidden] -> [n, dim]


def moe_reference(x: torch.Tensor, params: dict[str, torch.Tensor]) -> torch.Tensor:
    """Single-device MoE layer: ``gate * expert_e(x)`` for each token's chosen expert,
    ``[T, dim]``."""
    expert, gate = route(x, params["router"])
    out = torch.zeros_like(x)  # [T, dim]
    for e in range(params["w1"].shape[0]):
        mine = expert == e
        out[mine] = _expert(x[mine], params["w1"][e], params["w2"][e])
    return gate[:, None] * out


def _group_of(rank: int, world_size: int, mesh_sizes: Sequence[int] | None,
              mesh_names: Sequence[str] | None, axis: str | None):
    """(group handle or None for the world, ranks of my group, my index in it)."""
    if mesh_sizes is None:
        return None, list(range(world_size)), rank
    mesh = Mesh(tuple(mesh_sizes), tuple(mesh_names))
    if mesh.world_size != world_size:
        raise ValueError(f"mesh_sizes must multiply to world_size {world_size}; "
                         f"got {list(mesh_sizes)}")
    group, ranks = axis_group(mesh, rank, axis)
    return group, ranks, ranks.index(rank)


def moe_expert_parallel(rank: int, world_size: int, seed: int, tokens_per_rank: int,
                        n_experts: int, mesh_sizes: Sequence[int] | None = None,
                        mesh_names: Sequence[str] | None = None,
                        ep_axis: str | None = None) -> dict:
    """Worker: one MoE layer with its experts spread over the EP group, tokens moved by all-to-all.

    The EP group is the whole world, or the groups along ``ep_axis`` of the mesh
    ``mesh_sizes``/``mesh_names`` (e.g. EP reusing the DP groups). Expert ``e`` lives on EP
    rank ``e // (n_experts / ep)``. Rank r's tokens are rows ``r*T .. (r+1)*T`` of
    :func:`moe_tokens`. Returns ``{"out": [T, dim] numpy, "sent": tokens sent to each EP rank,
    "received": tokens received from each EP rank, "my_experts": [...]}``.
    """
    import torch.distributed as dist

    _check_int("tokens_per_rank", tokens_per_rank)
    group, ep_ranks, ep_rank = _group_of(rank, world_size, mesh_sizes, mesh_names, ep_axis)
    ep = len(ep_ranks)
    if n_experts % ep:
        raise ValueError(f"n_experts must be a multiple of the EP group size {ep}; got {n_experts}")
    per_rank = n_experts // ep
    params = backend.to_device(make_moe(seed, n_experts))
    my_experts = list(range(ep_rank * per_rank, (ep_rank + 1) * per_rank))
    w1, w2 = params["w1"][my_experts], params["w2"][my_experts]  # only my experts are used here

    x = backend.to_device(moe_tokens(seed, world_size * tokens_per_rank)
                          [rank * tokens_per_rank:(rank + 1) * tokens_per_rank])  # [T, dim]
    expert, gate = route(x, params["router"])              # [T], [T]
    dest = expert // per_rank                              # [T] EP rank that holds the expert
    order = torch.argsort(dest, stable=True)               # group my tokens by destination
    send_counts = torch.bincount(dest, minlength=ep)       # [ep]
    recv_counts = torch.empty_like(send_counts)            # [ep]
    dist.all_to_all_single(recv_counts, send_counts, group=group)  # who sends me how many
    send_split, recv_split = send_counts.tolist(), recv_counts.tolist()

    # all-to-all 1: tokens (and their expert ids) go to the rank holding their expert
    recv_x = x.new_empty(sum(recv_split), x.shape[1])      # [R, dim]
    dist.all_to_all_single(recv_x, x[order].contiguous(), recv_split, send_split, group=group)
    recv_e = expert.new_empty(sum(recv_split))             # [R]
    dist.all_to_all_single(recv_e, expert[order].contiguous(), recv_split, send_split, group=group)

    y_recv = torch.zeros_like(recv_x)                      # [R, dim]
    for i, e in enumerate(my_experts):
        mine = recv_e == e
        y_recv[mine] = _expert(recv_x[mine], w1[i], w2[i])

    # all-to-all 2: results go back to the ranks their tokens came from (splits swapped)
    y_sorted = x.new_empty(x.shape)                        # [T, dim]
    dist.all_to_all_single(y_sorted, y_recv, send_split, recv_split, group=group)
    y = torch.empty_like(y_sorted)
    y[order] = y_sorted                                    # undo the sort
    out = gate[:, None] * y                                # [T, dim]
    return {"out": backend.to_cpu(out).numpy().copy(), "sent": send_split, "received": recv_split,
            "my_experts": my_experts, "ep_ranks": ep_ranks}


# --------------------------------------------------------------- sequence/context parallelism


def attention_inputs(seed: int, seq: int, heads: int,
                     head_dim: int = 4) -> tuple[torch.Tensor, ...]:
    """``q, k, v`` of shape ``[seq, heads, head_dim]`` for ``seed``."""
    for name, value in (("seq", seq), ("heads", heads), ("head_dim", head_dim)):
        _check_int(name, value)
    g = torch.Generator().manual_seed(20_000 + seed)
    return tuple(torch.randn(seq, heads, head_dim, generator=g) for _ in range(3))


def attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        causal: bool = True) -> torch.Tensor:
    """Single-device multi-head attention over the whole sequence: ``[seq, heads, head_dim]``."""
    qh, kh, vh = (t.transpose(0, 1) for t in (q, k, v))    # [heads, seq, head_dim]
    out = torch.nn.functional.scaled_dot_product_attention(qh, kh, vh, is_causal=causal)
    return out.transpose(0, 1)                             # [seq, heads, head_dim]


def _seq_to_heads(x: torch.Tensor, sp: int, group) -> torch.Tensor:
    """All-to-all: ``[seq/sp, heads, d]`` (my tokens, all heads) -> ``[seq, heads/sp, d]``."""
    import torch.distributed as dist

    sends = [c.contiguous() for c in x.chunk(sp, dim=1)]   # sp x [seq/sp, heads/sp, d]
    recvs = [torch.empty_like(sends[0]) for _ in range(sp)]
    dist.all_to_all(recvs, sends, group=group)
    return torch.cat(recvs, dim=0)                         # [seq, heads/sp, d], sequence order


def _heads_to_seq(x: torch.Tensor, sp: int, group) -> torch.Tensor:
    """All-to-all back: ``[seq, heads/sp, d]`` -> ``[seq/sp, heads, d]``."""
    import torch.distributed as dist

    sends = [c.contiguous() for c in x.chunk(sp, dim=0)]   # sp x [seq/sp, heads/sp, d]
    recvs = [torch.empty_like(sends[0]) for _ in range(sp)]
    dist.all_to_all(recvs, sends, group=group)
    return torch.cat(recvs, dim=1)                         # [seq/sp, heads, d], head order


def ulysses_attention(rank: int, world_size: int, seed: int, seq: int, heads: int,
                      mesh_sizes: Sequence[int] | None = None,
                      mesh_names: Sequence[str] | None = None,
                      sp_axis: str | None = None, causal: bool = True) -> dict:
    """Worker: attention with the sequence split over the SP group (Ulysses all-to-all).

    SP rank i holds tokens ``i*seq/sp .. (i+1)*seq/sp`` of :func:`attention_inputs`. Returns
    ``{"out": [seq/sp, heads, d] numpy, "local_shape", "heads_shape", "sent_elements"}``
    where ``sent_elements`` counts elements this rank sent to *other* ranks in the four
    all-to-alls (q, k, v in; output back).
    """
    _check_int("seq", seq)
    _check_int("heads", heads)
    group, sp_ranks, sp_rank = _group_of(rank, world_size, mesh_sizes, mesh_names, sp_axis)
    sp = len(sp_ranks)
    if seq % sp or heads % sp:
        raise ValueError(f"seq and heads must be multiples of the SP group size {sp}; "
                         f"got seq={seq}, heads={heads}")
    q, k, v = backend.to_device(attention_inputs(seed, seq, heads))
    rows = slice(sp_rank * seq // sp, (sp_rank + 1) * seq // sp)
    local = [t[rows] for t in (q, k, v)]                   # 3 x [seq/sp, heads, d]
    qh, kh, vh = (_seq_to_heads(t, sp, group) for t in local)  # 3 x [seq, heads/sp, d]
    out_heads = attention_reference(qh, kh, vh, causal)    # [seq, heads/sp, d]: whole sequence
    out = _heads_to_seq(out_heads, sp, group)              # [seq/sp, heads, d]
    # four all-to-alls, each keeping 1/sp at home: the ring's share, in elements
    sent = round(ring_bytes("all_to_all", 4 * local[0].numel(), sp))
    return {"out": backend.to_cpu(out).numpy().copy(), "local_shape": list(local[0].shape),
            "heads_shape": list(qh.shape), "sent_elements": sent, "sp_ranks": sp_ranks}


def check_moe(seed: int, world_size: int = 4, tokens_per_rank: int = 6, n_experts: int = 4,
              mesh_sizes: Sequence[int] | None = None, mesh_names: Sequence[str] | None = None,
              ep_axis: str | None = None, timeout_s: float = 120.0) -> list[dict]:
    """Launch :func:`moe_expert_parallel`, assert every rank's output equals one device's, and
    that what rank i sent to j is what j received from i; returns the ranks' results."""
    from course_utils import launch

    worker = functools.partial(moe_expert_parallel, seed=seed, tokens_per_rank=tokens_per_rank,
                               n_experts=n_experts, mesh_sizes=mesh_sizes,
                               mesh_names=mesh_names, ep_axis=ep_axis)
    results = launch.run(worker, world_size, timeout_s=timeout_s)
    ref = moe_reference(moe_tokens(seed, world_size * tokens_per_rank), make_moe(seed, n_experts))
    T = tokens_per_rank
    for rank, res in enumerate(results):
        torch.testing.assert_close(torch.as_tensor(res["out"]), ref[rank * T:(rank + 1) * T])
        for j, peer in enumerate(res["ep_ranks"]):
            me = results[peer]["ep_ranks"].index(rank)
            assert res["sent"][j] == results[peer]["received"][me]
    return results


def check_ulysses(seed: int, world_size: int = 4, seq: int = 8, heads: int = 4,
                  mesh_sizes: Sequence[int] | None = None, mesh_names: Sequence[str] | None = None,
                  sp_axis: str | None = None, causal: bool = True,
                  timeout_s: float = 120.0) -> list[dict]:
    """Launch :func:`ulysses_attention`, assert each rank's slice equals one device's attention."""
    from course_utils import launch

    worker = functools.partial(ulysses_attention, seed=seed, seq=seq, heads=heads,
                               mesh_sizes=mesh_sizes, mesh_names=mesh_names, sp_axis=sp_axis,
                               causal=causal)
    results = launch.run(worker, world_size, timeout_s=timeout_s)
    ref = attention_reference(*attention_inputs(seed, seq, heads), causal=causal)
    for rank, res in enumerate(results):
        sp, i = len(res["sp_ranks"]), res["sp_ranks"].index(rank)
        torch.testing.assert_close(torch.as_tensor(res["out"]),
                                   ref[i * seq // sp:(i + 1) * seq // sp])
    return results


__all__ += ["check_moe", "check_ulysses"]


def draw_token_routing(runs: dict[str, list[dict]]):
    """Figure: for each run of :func:`check_moe` (``{title: results}``, EP over the whole
    world), a matrix of how many tokens each rank sends to each expert's rank, shaded in the
    expert-parallel colour, with each expert's total load under its column. Returns the figure."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    from course_utils import style

    cmap = LinearSegmentedColormap.from_list("ep", ["#ffffff", style.AXIS_COLORS["ep"]])
    fig, axes = plt.subplots(1, len(runs), figsize=(9, 3.9), layout="constrained",
                             squeeze=False)
    for ax, (title, results) in zip(axes[0], runs.items()):
        sent = [res["sent"] for res in results]                 # [rank][EP rank]
        n = len(sent)
        top = max(max(row) for row in sent) or 1
        ax.imshow(sent, cmap=cmap, vmin=0, vmax=top)
        for i, row in enumerate(sent):
            for j, count in enumerate(row):
                _ = ax.text(j, i, str(count), ha="center", va="center",
                            color="white" if count > 0.6 * top else "black")
        load = [sum(res["received"]) for res in results]
        experts = [res["my_experts"] for res in results]
        _ = ax.set_xticks(range(n), [
            f"rank {j}\n{_experts(e)}\n{load[j]} token{'' if load[j] == 1 else 's'}"
            for j, e in enumerate(experts)])
        _ = ax.set_yticks(range(n), [f"rank {i}" for i in range(n)])
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        _ = ax.set_ylabel("tokens from")
        _ = ax.set_title(title)
    _ = fig.supxlabel("to the rank that holds the token's expert (under it: the tokens it gets)")
    return fig


def _experts(ids: list[int]) -> str:
    return ("expert " if len(ids) == 1 else "experts ") + ", ".join(map(str, ids))


def _rank_shades(colour: str, n: int) -> list[str]:
    """``n`` shades of ``colour``, light to dark: one per sending rank."""
    from matplotlib.colors import to_hex, to_rgb

    base = to_rgb(colour)
    mix = [0.75 - 1.1 * i / max(n - 1, 1) for i in range(n)]  # > 0 towards white, < 0 darker
    return [to_hex(tuple(c + f * (1 - c) if f >= 0 else c * (1 + f) for c in base)) for f in mix]


def _on(colour: str) -> str:
    from matplotlib.colors import to_rgb

    r, g, b = to_rgb(colour)
    return "white" if 0.299 * r + 0.587 * g + 0.114 * b < 0.55 else "black"


def draw_all_to_all(world_size: int = 4):
    """Figure: what one all-to-all does, on ``world_size`` ranks (2 to 8).

    Before it (left), rank i holds ``world_size`` chunks, chunk j addressed to rank j (``i→j``).
    After it (right), rank j holds chunk j of every rank, in rank order: the grid of (rank,
    chunk) is transposed. Each chunk keeps the shade of the rank that sent it, so a row of one
    shade on the left becomes a column on the right. The diagonal stays at home. Ulysses sends
    head groups this way, MoE tokens grouped by expert (with uneven chunk sizes). Returns the
    figure.
    """
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    from course_utils import style

    _check_int("world_size", world_size, minimum=2)
    if world_size > 8:
        raise ValueError(f"world_size must be at most 8 to stay readable; got {world_size}")
    n = world_size
    shades = _rank_shades(style.AXIS_COLORS["sp"], n)
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.45 * n + 1.9), layout="constrained")
    panels = [("before: chunk j is for rank j", "chunk j", False),
              ("after: chunk i came from rank i", "chunk i", True)]
    for ax, (title, xlabel, after) in zip(axes, panels):
        for row in range(n):
            for col in range(n):
                src, dst = (col, row) if after else (row, col)
                face = shades[src]
                ax.add_patch(Rectangle((col + 0.05, row + 0.06), 0.9, 0.88, facecolor=face,
                                       edgecolor="black" if src == dst else "none",
                                       linewidth=1.5))
                _ = ax.text(col + 0.5, row + 0.5, f"{src}→{dst}", ha="center", va="center",
                            color=_on(face))
        _ = ax.set_xlim(0, n)
        _ = ax.set_ylim(n, 0)
        _ = ax.set_xticks([c + 0.5 for c in range(n)], [str(c) for c in range(n)])
        _ = ax.set_yticks([r + 0.5 for r in range(n)], [f"rank {r}" for r in range(n)])
        ax.tick_params(length=0)
        for side in ax.spines.values():
            side.set_visible(False)
        _ = ax.set_xlabel(xlabel)
        _ = ax.set_title(title)
    _ = fig.suptitle("all-to-all: chunk j of rank i becomes chunk i of rank j")
    return fig


__all__ += ["draw_token_routing", "draw_all_to_all"]


def _demo(rank: int, world_size: int) -> str:
    res = moe_expert_parallel(rank, world_size, 0, 6, 2 * world_size)  # "out" on the CPU
    ref = moe_reference(moe_tokens(0, 6 * world_size),
                        make_moe(0, 2 * world_size))[rank * 6:(rank + 1) * 6]
    torch.testing.assert_close(torch.as_tensor(res["out"]), ref)
    return f"MoE all-to-all matches one device; sent {res['sent']}, received {res['received']}"


if __name__ == "__main__":
    from course_utils import launch

    launch.torchrun_main(_demo)
