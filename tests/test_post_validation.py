"""Post-validation with AdamW (course_utils.checkpoint.post_validation): the written-out AdamW step equals
torch.optim.AdamW bit for bit; the in-place rollback restores weights and moments to float
rounding, the kept copy exactly; post-validation either way equals clip_grad_norm_ + AdamW in
one process (in place to rounding, kept copy exactly), and without rollback it does not."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from course_utils.checkpoint import post_validation as pv
from course_utils.pipeline.runtime import make_model

SEEDS = (0, 1)
LR = 1e-2
# Measured (seeds 0-2, randn gradients, after 5 steps): one step then its in-place rollback
# leaves the weights within 3e-8 of before, exp_avg within 6e-8, exp_avg_sq within 1e-9
# (a few ulps of the larger operand; relative error is larger where m or p is near 0, by
# cancellation). Not bit exact. Post-validation in place ends 3e-8 to 7.5e-8 from the
# reference after 3 steps with rollbacks.
ATOL = 2e-7
ATOL_V = 1e-8


def _grads(params, seed, s):
    return [torch.randn(q.shape, generator=torch.Generator().manual_seed(100 * seed + 10 * s + i))
            for i, q in enumerate(params)]


def _state_equal(opt, model, params, st):
    return (all(torch.equal(a, b) for a, b in zip(model.parameters(), params))
            and all(torch.equal(opt.state[q]["exp_avg"], m)
                    for q, m in zip(model.parameters(), st.exp_avg))
            and all(torch.equal(opt.state[q]["exp_avg_sq"], v)
                    for q, v in zip(model.parameters(), st.exp_avg_sq))
            and all(opt.state[q]["step"].item() == st.step for q in model.parameters()))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adamw_step_equals_torch(seed, wd):
    ref = make_model(seed)
    params = list(make_model(seed).parameters())
    st = pv.AdamWState.zeros(params)
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, weight_decay=wd, foreach=False)
    for s, coef in enumerate([1.0, 0.6, 1.0, 0.25]):
        g = _grads(params, seed, s)
        for q, t in zip(ref.parameters(), g):
            q.grad = t * coef
        opt.step()
        pv.adamw_step(params, g, st, lr=LR, weight_decay=wd, coef=coef)
        assert _state_equal(opt, ref, params, st), f"step {s}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_rollback_restores_to_rounding(seed, wd):
    params = list(make_model(seed).parameters())
    st = pv.AdamWState.zeros(params)
    for s in range(3):
        pv.adamw_step(params, _grads(params, seed, s), st, lr=LR, weight_decay=wd)
    before = [t.clone() for t in (*params, *st.exp_avg, *st.exp_avg_sq)]
    g = _grads(params, seed, 7)
    pv.adamw_step(params, g, st, lr=LR, weight_decay=wd, coef=0.5)
    pv.adamw_rollback(params, g, st, lr=LR, weight_decay=wd, coef=0.5)
    n = len(params)
    assert st.step == 3
    for i, (now, old) in enumerate(zip((*params, *st.exp_avg, *st.exp_avg_sq), before)):
        torch.testing.assert_close(now, old, rtol=0, atol=ATOL_V if i >= 2 * n else ATOL)


def test_kept_copy_restores_exactly():
    params = list(make_model(0).parameters())
    st = pv.AdamWState.zeros(params)
    pv.adamw_step(params, _grads(params, 0, 0), st, lr=LR)
    before = [t.clone() for t in (*params, *st.exp_avg, *st.exp_avg_sq)]
    kept = pv.KeptCopy(params, st)
    assert kept.nbytes == 12 * sum(q.numel() for q in params)  # fp32: weight + two moments
    pv.adamw_step(params, _grads(params, 0, 1), st, lr=LR, coef=0.5)
    kept.restore(params, st)
    assert st.step == 1
    assert all(torch.equal(a, b) for a, b in zip((*params, *st.exp_avg, *st.exp_avg_sq), before))


def test_clip_coef_is_clip_grad_norm():
    model = make_model(0)
    for q, g in zip(model.parameters(), _grads(list(model.parameters()), 0, 0)):
        q.grad = g.clone()
    grads = [q.grad.clone() for q in model.parameters()]
    coef, norm = pv.clip_coef([torch.linalg.vector_norm(g) for g in grads], 0.5)
    total = nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    assert norm == total.item()
    assert all(torch.equal(q.grad, g * coef) for q, g in zip(model.parameters(), grads))


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("policy", sorted(pv.POLICIES))
def test_post_validation_with_rollbacks(seed, policy):
    res = pv.post_validation_run(p=4, steps=3, max_norm=0.12, policy=policy, seed=seed)
    assert all(n > 0.12 for n in res["norms"])  # clipping every step: wrong eager steps
    ways = res["ways"]
    n = res["reference"].numel()
    assert ways["in_place"]["rollbacks"] > 0
    assert ways["in_place"]["rollbacks"] == ways["kept_copy"]["rollbacks"]
    assert ways["kept_copy"]["max_abs_diff"] == 0.0
    assert 0.0 < ways["in_place"]["max_abs_diff"] <= ATOL
    assert ways["no_rollback"]["max_abs_diff"] > 1e-4  # keeping the wrong step is visibly off
    assert ways["in_place"]["extra_bytes"] == 0
    assert ways["kept_copy"]["extra_bytes_per_param"] == 12.0
    if policy == "partial":  # every stage steps eagerly and keeps a copy
        assert ways["kept_copy"]["extra_bytes"] == 12 * n
        assert ways["kept_copy"]["eager_steps"] == 4 * 3
    else:  # stages whose partial norm is already over max_norm wait instead
        assert 0 < ways["kept_copy"]["extra_bytes"] < 12 * n
        assert ways["kept_copy"]["eager_steps"] < 4 * 3


def test_post_validation_without_rollback():
    res = pv.post_validation_run(p=4, steps=3, max_norm=1.0)
    assert all(nm < 1.0 for nm in res["norms"])
    n = res["reference"].numel()
    for way, row in res["ways"].items():
        assert row["rollbacks"] == 0 and row["eager_steps"] == 4 * 3, way
        assert row["max_abs_diff"] == 0.0, way
    assert res["ways"]["kept_copy"]["extra_bytes"] == 12 * n  # copied every step all the same
    assert res["ways"]["in_place"]["extra_bytes"] == 0


def _step(**kw):
    params = list(make_model(0).parameters())
    args = {"params": params, "grads": _grads(params, 0, 0), "state": pv.AdamWState.zeros(params),
            "lr": LR}
    args.update(kw)
    pv.adamw_step(**args)


@pytest.mark.parametrize("name, call", [
    ("lr", lambda: _step(lr=0.0)),
    ("betas", lambda: _step(betas=(0.9,))),
    ("betas", lambda: _step(betas=(1.0, 0.999))),
    ("eps", lambda: _step(eps=-1e-8)),
    ("weight_decay", lambda: _step(weight_decay=-0.1)),
    ("weight_decay", lambda: _step(lr=0.5, weight_decay=2.0)),
    ("coef", lambda: _step(coef=0.0)),
    ("grads", lambda: _step(grads=[])),
    ("state", lambda: _step(state=None)),
    ("state", lambda: pv.adamw_rollback(list(make_model(0).parameters()),
                                        _grads(list(make_model(0).parameters()), 0, 0),
                                        pv.AdamWState.zeros(list(make_model(0).parameters())))),
    ("norms", lambda: pv.clip_coef([], 1.0)),
    ("max_norm", lambda: pv.clip_coef([torch.tensor(1.0)], 0.0)),
    ("p", lambda: pv.post_validation_run(p=0)),
    ("steps", lambda: pv.post_validation_run(steps=0)),
    ("seed", lambda: pv.post_validation_run(seed=-1)),
    ("policy", lambda: pv.post_validation_run(policy="eager")),
    ("max_norm", lambda: pv.post_validation_run(max_norm=-1.0)),
    ("lr", lambda: pv.post_validation_run(lr=float("nan"))),
])
def test_bad_arguments_name_themselves(name, call):
    with pytest.raises(ValueError, match=name):
        call()
