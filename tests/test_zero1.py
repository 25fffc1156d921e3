"""ZeRO-1 as a wrapper of any torch.optim optimizer, and the gradient buffer that feeds it.

Each test runs real gloo ranks and compares with one process over two seeds: the wrapper
(AdamW with weight decay, SGD with momentum, Adam) on models with a frozen parameter and with
tied weights, as Stanford CS336's sharded-optimizer test drives one; the contiguous fp32
buffer with bucketed reduce-scatters; the bytes each rank sends; and what PyTorch's own
ZeroRedundancyOptimizer does instead (whole parameters, broadcasts).
"""

from __future__ import annotations

import copy

import pytest
import torch
import torch.distributed as dist
from torch import nn

from course_utils import launch
from course_utils.runtime import clock
from course_utils.zero import zero1
from course_utils.zero.grad_buffer import FlatLayout, GradBuffer
from course_utils.zero.zero1 import ShardedOptimizer
from rank_jobs import job, run_jobs

SEEDS = (0, 1)
OPTIMIZERS = {
    "adamw": (torch.optim.AdamW, dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)),
    "sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    "adam": (torch.optim.Adam, dict(lr=0.01)),
}


class _WithFrozen(nn.Module):
    """Three linears, one with a frozen bias, and a parameter no gradient ever reaches."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(10, 10, bias=False)
        self.b = nn.Linear(10, 50)
        self.b.bias.requires_grad_(False)
        self.c = nn.Linear(50, 5, bias=False)
        self.unused = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


class _Tied(nn.Module):
    """Five linears, the second and the fourth sharing one weight."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(10, 10, bias=False), nn.Linear(10, 50, bias=False)
        self.c, self.d = nn.Linear(50, 10, bias=False), nn.Linear(10, 50, bias=False)
        self.e = nn.Linear(50, 5, bias=False)
        self.d.weight = self.b.weight

    def forward(self, x):
        for layer in (self.a, self.b, self.c, self.d):
            x = torch.relu(layer(x))
        return self.e(x)


MODELS = {"frozen": _WithFrozen, "tied": _Tied}


def _wrapper_worker(rank, world_size, model_name, opt_name, seed):
    """The same data on every rank (as CS336's test): one plain optimizer, one sharded."""
    torch.manual_seed(seed)
    plain = MODELS[model_name]()
    sharded = copy.deepcopy(plain)
    cls, kwargs = OPTIMIZERS[opt_name]
    ref, ours = cls(plain.parameters(), **kwargs), ShardedOptimizer(sharded.parameters(), cls,
                                                                    **kwargs)
    gen = torch.Generator().manual_seed(100 + seed)
    for _ in range(6):
        x, y = torch.rand(32, 10, generator=gen), torch.rand(32, 5, generator=gen)
        for model, opt in ((plain, ref), (sharded, ours)):
            opt.zero_grad()
            ((y - model(x)) ** 2).sum().backward()
            opt.step()
    held = sum(t.numel() for s in ours.state.values() for t in s.values() if t.dim() > 0)
    return ([p.detach().numpy().copy() for p in plain.parameters()],
            [p.detach().numpy().copy() for p in sharded.parameters()], held)


def _scheduled_worker(rank, world_size, seed):
    """A LambdaLR warm-up and decay drives the wrapped AdamW as it drives the plain one; the
    wrapper's state_dict holds this rank's slices only."""
    torch.manual_seed(seed)
    plain = _WithFrozen()
    sharded = copy.deepcopy(plain)
    kwargs = dict(lr=0.1, weight_decay=0.1)
    ref = torch.optim.AdamW(plain.parameters(), **kwargs)
    ours = ShardedOptimizer(sharded.parameters(), torch.optim.AdamW, **kwargs)
    schedule = lambda step: min(1.0, (step + 1) / 3) * 0.8 ** step   # noqa: E731
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, schedule) for o in (ref, ours)]
    gen = torch.Generator().manual_seed(100 + seed)
    lrs = []
    for _ in range(6):
        x, y = torch.rand(32, 10, generator=gen), torch.rand(32, 5, generator=gen)
        for model, opt, sched in zip((plain, sharded), (ref, ours), scheds):
            opt.zero_grad()
            ((y - model(x)) ** 2).sum().backward()
            opt.step()
            sched.step()
        lrs.append((ref.param_groups[0]["lr"], ours.inner.param_groups[0]["lr"]))
    held = sum(t.numel() for s in ours.state_dict()["state"].values() for t in s.values()
               if t.dim() > 0)
    return ([p.detach().numpy().copy() for p in plain.parameters()],
            [p.detach().numpy().copy() for p in sharded.parameters()], lrs, held)


@pytest.fixture(scope="module")
def ranks():
    """Every run of this file that ends on every rank and measures no bytes sent, one launch
    per world size: {key: each rank's result}."""
    jobs = {("wrapper", m, o, s): (2, job(_wrapper_worker, model_name=m, opt_name=o, seed=s))
            for m in MODELS for o in OPTIMIZERS for s in SEEDS}
    jobs["frozen"] = 2, job(_frozen_worker)
    jobs.update({("scheduled", s): (2, job(_scheduled_worker, seed=s)) for s in SEEDS})
    jobs.update({("buffer", ws, s): (ws, job(_buffer_worker, seed=s))
                 for ws in (2, 3) for s in SEEDS})
    jobs.update({("accumulation", s): (1, job(_accumulation_worker, seed=s)) for s in SEEDS})
    jobs["zero_redundancy"] = 2, job(_zero_redundancy_worker)
    out = {}
    for ws in sorted({ws for ws, _ in jobs.values()}):
        keys = [k for k, (w, _) in jobs.items() if w == ws]
        out.update(zip(keys, run_jobs([jobs[k][1] for k in keys], ws, threads_per_rank=None)))
    return out


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("opt_name", sorted(OPTIMIZERS))
@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_the_wrapper_equals_the_plain_optimizer(ranks, model_name, opt_name, seed):
    for plain, sharded, held in ranks["wrapper", model_name, opt_name, seed]:
        for a, b in zip(plain, sharded):
            torch.testing.assert_close(torch.as_tensor(b), torch.as_tensor(a), rtol=1e-6,
                                       atol=1e-7)
        assert held > 0


@pytest.mark.parametrize("seed", SEEDS)
def test_a_learning_rate_scheduler_drives_the_wrapper(ranks, seed):
    """CS336's test with a LambdaLR on top: torch's schedulers take only an Optimizer."""
    results = ranks["scheduled", seed]
    trainable = sum(p.numel() for p in _WithFrozen().parameters() if p.requires_grad)
    for plain, sharded, lrs, held in results:
        for a, b in zip(plain, sharded):
            torch.testing.assert_close(torch.as_tensor(b), torch.as_tensor(a), rtol=1e-6,
                                       atol=1e-6)
        assert all(a == b for a, b in lrs) and len({a for a, _ in lrs}) == 6
    # its state_dict: AdamW's two moments of each trained element, on one rank only
    assert sum(r[3] for r in results) == 2 * trainable


def _frozen_worker(rank, world_size):
    torch.manual_seed(0)
    model = _WithFrozen()
    before = model.unused.detach().clone(), model.b.bias.detach().clone()
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.1, weight_decay=0.5)
    ((model(torch.rand(4, 10))) ** 2).sum().backward()
    opt.step()
    untouched = torch.equal(model.unused, before[0]) and torch.equal(model.b.bias, before[1])
    frozen = {id(p) for p in (model.unused, model.b.bias)}
    pieces_of_frozen = [k for k, (i, _, _) in zip(opt._masters, opt._pieces)
                        if id(opt.params[i]) in frozen]
    return untouched, all(k not in opt.state for k in pieces_of_frozen)


def test_a_parameter_without_a_gradient_is_skipped_as_torch_optim_does(ranks):
    """Weight decay would move a frozen parameter; torch.optim skips it, and so does the
    wrapper (no error blaming backward, no state for it)."""
    assert ranks["frozen"] == [(True, True)] * 2


def _buffer_worker(rank, world_size, seed):
    """DP only: each rank its rows; the buffer's reduce-scatters, AdamW on the slices."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(12, 40), nn.GELU(), nn.Linear(40, 40), nn.GELU(),
                          nn.Linear(40, 3))
    ref = copy.deepcopy(model)
    params = list(model.parameters())[::-1]
    opt = ShardedOptimizer(params, torch.optim.AdamW, bucket_numel=100, lr=1e-2,
                           weight_decay=0.1)
    grads = GradBuffer(opt.params, opt.layout)
    opt.grads = grads
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2, weight_decay=0.1)
    gen = torch.Generator().manual_seed(seed)
    cats = []
    real_cat = torch.cat
    for step in range(4):
        x, y = torch.randn(6 * world_size, 12, generator=gen), torch.randn(6 * world_size, 3,
                                                                           generator=gen)
        nn.functional.mse_loss(ref(x), y).backward()
        ref_opt.step()
        ref_opt.zero_grad()
        mine = slice(6 * rank, 6 * rank + 6)
        for half in (0, 1):   # two microbatches, the buckets go out in the second backward
            grads.active = half == 1
            rows = slice(mine.start + 3 * half, mine.start + 3 * half + 3)
            (nn.functional.mse_loss(model(x[rows]), y[rows]) / 2).backward()
        torch.cat = lambda *a, **k: (cats.append(1), real_cat(*a, **k))[1]
        try:
            grads.finish()
            opt.step()
        finally:
            torch.cat = real_cat
        opt.zero_grad()
        grads.zero()
    storages = {p.main_grad.untyped_storage().data_ptr() for p in params}
    diff = max(float((p.detach() - q.detach()).abs().max())
               for p, q in zip(model.parameters(), ref.parameters()))
    return diff, len(cats), storages == {grads.flat.untyped_storage().data_ptr()}, \
        grads.flat.dtype == torch.float32, len(opt.layout.buckets)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("seed", SEEDS)
def test_gradient_buffer_and_sharded_adamw_equal_one_process(ranks, world_size, seed):
    for diff, cats, one_buffer, fp32, buckets in ranks["buffer", world_size, seed]:
        assert diff < 1e-5
        assert cats == 0                   # nothing concatenated: a bucket is the buffer
        assert one_buffer and fp32 and buckets >= 3


def _accumulation_worker(rank, world_size, seed, k=16):
    """bf16 weights, k microbatches: the buffer against the fp32 and the bf16 sums of the
    microbatches' own bf16 gradients."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 4)).to(torch.bfloat16)
    params = list(model.parameters())
    opt = ShardedOptimizer(params, torch.optim.SGD, master_dtype=torch.float32, lr=0.1)
    grads = GradBuffer(opt.params, opt.layout)
    grads.active = False                       # no communication: accumulation only
    x = torch.randn(k, 2, 16, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16)
    alone = []
    for i in range(k):
        copy_ = copy.deepcopy(model)
        copy_(x[i]).float().square().mean().backward()
        alone.append([p.grad for p in copy_.parameters()])
        model(x[i]).float().square().mean().backward()
    fp32 = [sum(g[j].float() for g in alone) for j in range(len(params))]
    bf16 = []
    for j in range(len(params)):
        total = torch.zeros_like(alone[0][j])
        for g in alone:
            total += g[j]
        bf16.append(total)
    same = all(torch.equal(p.main_grad, f) for p, f in zip(params, fp32))
    lost = max(float((b.float() - f).abs().max()) for b, f in zip(bf16, fp32))
    return same, lost, all(p.main_grad.dtype == torch.float32 for p in params)


@pytest.mark.parametrize("seed", SEEDS)
def test_bf16_gradients_accumulate_in_fp32(ranks, seed):
    """Each microbatch's bf16 gradient is added into the fp32 buffer: the buffer holds exactly
    their fp32 sum, which a bf16 accumulation misses."""
    [(same, lost, fp32)] = ranks["accumulation", seed]
    assert same and fp32 and lost > 0


@pytest.mark.skipif(clock.bytes_written() is None, reason="no /proc/self/io on this host")
@pytest.mark.parametrize("world_size", [2, 4])
def test_zero1_sends_what_one_all_reduce_sends(world_size):
    """Per rank: 2(D-1)/D of the bytes, against 3(D-1)/D for an all-reduce then an all-gather
    (measured: bytes written to the sockets)."""
    share = (world_size - 1) / world_size
    for r in launch.run(zero1.bytes_sent_worker, world_size, timeout_s=120):
        assert abs(r["reduce-scatter + all-gather"] - 2 * share) < 0.05 * share
        assert abs(r["all-reduce + all-gather"] - 3 * share) < 0.1 * share


def _zero_redundancy_worker(rank, world_size):
    from torch.distributed.optim import ZeroRedundancyOptimizer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 30), nn.Linear(30, 4), nn.Linear(4, 2))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.1)
    model(torch.rand(3, 8)).sum().backward()
    calls = {"broadcast": 0, "all_gather": 0}
    real = {k: getattr(dist, k) for k in calls}
    for k in calls:
        setattr(dist, k, lambda *a, k=k, **kw: (calls.__setitem__(k, calls[k] + 1),
                                                real[k](*a, **kw))[1])
    try:
        opt.step()
    finally:
        for k, fn in real.items():
            setattr(dist, k, fn)
    mine = [p for p in model.parameters() if p in opt.optim.state]
    whole = all(opt.optim.state[p]["exp_avg"].shape == p.shape for p in mine)
    return sorted(p.numel() for p in mine), whole, calls


def test_torchs_zero_redundancy_optimizer_keeps_whole_parameters_and_broadcasts(ranks):
    """What zero1's docstring says of PyTorch's ZeroRedundancyOptimizer: each parameter's state
    lives whole on one rank, sizes packed greedily, and the update is sent by broadcast."""
    results = ranks["zero_redundancy"]
    owned = sorted(n for numels, _, _ in results for n in numels)
    assert owned == sorted(p.numel() for p in nn.Sequential(
        nn.Linear(8, 30), nn.Linear(30, 4), nn.Linear(4, 2)).parameters())   # each once
    assert [numels for numels, _, _ in results] == [[240], [2, 4, 8, 30, 120]]   # greedy
    for _, whole, calls in results:
        assert whole and calls["broadcast"] > 0 and calls["all_gather"] == 0


# ----------------------------------------------------------------------------- the layout


@pytest.mark.parametrize("dp", [1, 2, 3, 4])
@pytest.mark.parametrize("cap", [None, 1, 5, 17, 100])
def test_every_element_is_owned_by_one_rank(dp, cap):
    numels = [7, 0, 12, 3, 30, 1]
    layout = FlatLayout(numels, dp, cap)
    owners = {}
    for r in range(dp):
        for i, lo, n in layout.pieces(r):
            for k in range(lo, lo + n):
                assert (i, k) not in owners
                owners[(i, k)] = r
    assert len(owners) == sum(numels)
    assert sum(layout.owned(r) for r in range(dp)) == sum(numels)
    for lo, hi in layout.buckets:
        assert (hi - lo) % dp == 0                          # padded to a multiple of D
    if cap is not None:                                     # a bucket closes at the cap
        for b, (lo, hi) in enumerate(layout.buckets[:-1]):
            filled = sum(n for i, n in enumerate(numels) if layout.bucket_of[i] == b)
            assert filled >= cap


def test_flat_layout_lives_in_the_gradient_buffer_and_keeps_its_zero1_name():
    from course_utils.zero import grad_buffer
    assert zero1.FlatLayout is grad_buffer.FlatLayout is FlatLayout


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="params must be a non-empty"):
        ShardedOptimizer([])
    with pytest.raises(ValueError, match="numels must be"):
        FlatLayout([], 2)
    with pytest.raises(ValueError, match="dp_size must be an int >= 1"):
        FlatLayout([3], 0)
