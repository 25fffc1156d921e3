"""Judge of a3_zero: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.
"""

import torch

from course_utils.assess.checks import check_choice, check_number

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["memory.zero_state_bytes", "zero.padded_state_bytes"],
    "q2": ["memory.zero_state_bytes", "zero.padded_state_bytes"],
    "q3": ["memory.zero_state_bytes", "zero.padded_state_bytes", "memory.fits"],
}


def _stages(n, dp):
    """Persistent GB per rank of stages 0-3 (16-byte layout)."""
    return {0: 16 * n / 1e9, 1: (4 + 12 / dp) * n / 1e9, 2: (2 + 14 / dp) * n / 1e9,
            3: 16 * n / dp / 1e9}


def q1_test(got, ref):
    n, dp = got.givens.q1
    gb = _stages(n, dp)
    right, weights = gb[2], 2 * n / 1e9
    check_number("zero2_gb", got["zero2_gb"], right, unit="GB", mistakes=[
        (gb[3], f"{gb[3]:g} GB is 16N/D, everything divided by D: that is ZeRO-3. ZeRO-2 shards "
                f"gradients and optimizer state but every rank keeps all the bf16 weights "
                f"(2 x N bytes = {weights:g} GB)"),
        (right * 1e9 / 2**30, "that is GiB (2^30 bytes); the question asks for GB (10^9 bytes)"),
        (right - 2 * n / dp / 1e9, f"you forgot the gradients: ZeRO-2 keeps 2 bytes of gradient "
                                   f"per parameter, sharded over the {dp} ranks "
                                   f"({2 * n / dp / 1e9:g} GB)"),
        (gb[1], f"{gb[1]:g} GB is ZeRO-1: the gradients are still replicated there. ZeRO-2 "
                "shards them too"),
        (gb[0], f"{gb[0]:g} GB is replicated data parallelism, nothing sharded"),
        (right - weights, f"{right - weights:g} GB is only the sharded part (gradients + "
                          f"optimizer); add the replicated bf16 weights ({weights:g} GB)"),
        (right * 1e9, "that is bytes; the question asks for GB"),
    ])


def _check_zero_gb(got, case, n, dp, stage, expected):
    name = f"zero_gb on hidden case {case}, stage {stage}"
    wrong_stages = {
        0: 16 * n / 1e9, 1: (4 + 12 / dp) * n / 1e9, 2: (2 + 14 / dp) * n / 1e9,
        3: 16 * n / dp / 1e9}
    mistakes = [(value, f"that is the stage-{s} figure: stage {stage} shards "
                        + ["nothing", "the optimizer state (master + moments, 12 B)",
                           "the optimizer state and the gradients",
                           "optimizer state, gradients and weights"][stage])
                for s, value in wrong_stages.items() if s != stage]
    mistakes += [(expected * 1e9 / 2**30, "that is GiB (2^30 bytes); the answer is in GB "
                                          "(10^9 bytes)"),
                 (expected * 1e9, "that is bytes; the answer is in GB")]
    mistakes.append((expected - 4 * n / 1e9 / (dp if stage >= 1 else 1), "the optimizer "
                     "bucket is 12 bytes per parameter: the fp32 master copy (4) as well as the "
                     "two fp32 moments (8)"))
    check_number(name, got[name], expected, unit="GB", mistakes=mistakes)


def _draw_zero_gb(rng):
    """zero_gb's hidden cases, drawn per submission: four (parameters, D), D >= 2 so that the
    four stages' figures differ."""
    sizes = [1.3e9, 1.5e9, 2.7e9, 3e9, 6.7e9, 7e9, 8e9, 13e9, 30e9, 34e9, 65e9, 70e9, 175e9]
    return [[rng.choice(sizes), rng.choice([2, 3, 4, 6, 8, 12, 16, 24, 32, 64, 128])]
            for _ in range(4)]


def _draw_shard_step(rng):
    """sharded_adam_step's hidden runs, drawn per submission: (seed, D, S, steps, lr, betas,
    eps). eps = 0.1 makes Adam sensitive to the gradient's scale, so a missing 1/D shows."""
    seeds = rng.sample(range(1, 10_000), 3)
    return [[seeds[0], 2, rng.randint(3, 6), 3, 1e-2, [0.9, 0.999], 0.1],
            [seeds[1], 2, rng.randint(3, 6), 2, 1e-3, [0.9, 0.999], 1e-8],
            [seeds[2], 3, rng.randint(2, 4), 3, 1e-2, [0.8, 0.99], 0.1]]


HIDDEN_CASES = {"q2_test": _draw_zero_gb, "q4_test": _draw_shard_step}


def q2_test(got, ref):
    for case, (n, dp) in enumerate(got.cases, 1):
        for stage, want in enumerate([16 * n, (4 + 12 / dp) * n, (2 + 14 / dp) * n, 16 * n / dp]):
            _check_zero_gb(got, case, n, dp, stage, want / 1e9)


def q3_test(got, ref):
    n, dp, device_gb, reserve_gb = got.givens.q3
    left, gb = device_gb - reserve_gb, _stages(n, dp)
    answer = min(s for s in range(4) if gb[s] <= left)
    why = {0: "with nothing sharded, a device holds 16 bytes per parameter",
           1: "under ZeRO-1 the bf16 weights and gradients stay whole on every device",
           2: "under ZeRO-2 the whole bf16 weight buffer stays on every device",
           3: "even with everything sharded (ZeRO-3)"}
    mistakes = {}
    for s in range(4):
        if gb[s] > left:
            mistakes[s] = (f"{why[s]}: {gb[s]:g} GB per device, more than the {left:g} GB left "
                           f"once {reserve_gb:g} GB are kept for activations"
                           + (" (did you forget that reserve, or mix GB and GiB?)"
                              if gb[s] <= device_gb else ""))
        elif s > answer:
            mistakes[s] = (f"ZeRO-{s} fits ({gb[s]:g} GB), but a lower stage fits as well and "
                           "communicates no more: the question asks for the smallest stage")
    check_choice("smallest_stage", got["smallest_stage"], answer, [0, 1, 2, 3],
                 mistakes=mistakes)


def _adam_reference(full_master, local_grads, lr, betas, eps, *, reduce="mean",
                    bias_correction=True):
    """Single process: Adam on the whole (P,) buffer with the mean of the ranks' gradients."""
    p = full_master.clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for step in range(1, local_grads.shape[0] + 1):
        g = local_grads[step - 1].sum(0) if reduce == "sum" else (
            local_grads[step - 1, 0] if reduce == "own" else local_grads[step - 1].mean(0))
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        c1 = 1 - betas[0] ** step if bias_correction else 1.0
        c2 = 1 - betas[1] ** step if bias_correction else 1.0
        p = p - lr * (m / c1) / ((v / c2).sqrt() + eps)
    return p


def _check_tensor(got, name, want, message, dtype=torch.float32):
    value = got[name]
    assert isinstance(value, torch.Tensor) and value.dtype == dtype, message
    torch.testing.assert_close(value, want, rtol=1e-5, atol=1e-6,
                               msg=lambda m: f"{message} {m}")


def _torch_adam(full, grads, lr, betas, eps):
    """torch.optim.Adam's own update (``torch.optim.adam.adam``, the function ``Adam.step``
    calls; the class would import torch._dynamo in the grader first, 1-2 s per submission) on
    the whole buffer with the ranks' mean gradient each step: (weights, exp_avg)."""
    from torch.optim.adam import adam

    weight, exp_avg, exp_avg_sq = full.clone(), torch.zeros_like(full), torch.zeros_like(full)
    step = torch.tensor(0.0)
    for grad in grads.mean(1):
        adam([weight], [grad], [exp_avg], [exp_avg_sq], [], [step], foreach=False,
             capturable=False, differentiable=False, fused=None, grad_scale=None,
             found_inf=None, has_complex=False, amsgrad=False, beta1=betas[0],
             beta2=betas[1], lr=lr, weight_decay=0.0, eps=eps, maximize=False)
    return weight, exp_avg


def _check_shard_step(got, number, seed, dp, s, n_steps, lr, betas, eps):
    """The inputs the hidden test used (same seeds), torch.optim.Adam on one process, and the
    known mistakes, against what every rank submitted."""
    betas = tuple(betas)
    gen = torch.Generator().manual_seed(seed)
    full = torch.randn(dp * s, generator=gen)                      # (P,)
    grads = torch.randn(n_steps, dp, dp * s, generator=gen)        # (steps, D, P)
    case = f"hidden case {number}"
    if not got[f"{case}: collectives called"]:
        raise AssertionError("no collective was called: each rank's local_grad comes from its own "
                             "micro-batch; the ranks' gradients must be combined (reduce-scatter)")
    expected, expected_avg = _torch_adam(full, grads, lr, betas, eps)
    wrong = {"sum": "you used the SUM of the ranks' gradients: divide by D for their mean",
             "own": "each rank used only its own gradient: reduce-scatter the ranks' gradients "
                    "first"}
    for rank in range(dp):
        mine = slice(rank * s, (rank + 1) * s)
        master = got[f"{case}, rank {rank}: master"]
        assert isinstance(master, torch.Tensor) and tuple(master.shape) == (s,), (
            f"rank {rank}: master should stay an ({s},) tensor")
        master = master.float()
        if not torch.allclose(master, expected[mine], rtol=1e-5, atol=1e-6):
            for kind, message in wrong.items():
                alt = _adam_reference(full, grads if kind != "own" else grads[:, rank:rank + 1],
                                      lr, betas, eps, reduce=kind)
                if torch.allclose(master, alt[mine], rtol=1e-5, atol=1e-6):
                    raise AssertionError(f"rank {rank}: {message}")
            alt = _adam_reference(full, grads, lr, betas, eps, bias_correction=False)
            if torch.allclose(master, alt[mine], rtol=1e-5, atol=1e-6):
                raise AssertionError(f"rank {rank}: Adam's bias correction is missing: divide m "
                                     "by (1 - beta1**step) and v by (1 - beta2**step)")
            if torch.allclose(master, full[mine]):
                raise AssertionError(f"rank {rank}: master was not updated in place "
                                     "(use master.sub_/addcdiv_ or master[:] = ...)")
            torch.testing.assert_close(master, expected[mine], rtol=1e-5, atol=1e-6,
                                       msg=lambda m: (
                f"rank {rank} (hidden case {number}, D = {dp}): the master slice differs from "
                f"torch.optim.Adam on the whole buffer. {m}"))
        _check_tensor(got, f"{case}, rank {rank}: exp_avg",
                      expected_avg[mine],
                      f"rank {rank}: exp_avg (Adam's first moment) was not updated in place "
                      "correctly.")
        _check_tensor(got, f"{case}, rank {rank}: returned", expected[mine].to(torch.bfloat16),
                      f"rank {rank}: return the new weight slice as a bf16 tensor (the updated "
                      "master rounded to bf16).", dtype=torch.bfloat16)


def q4_test(got, ref):
    for number, case in enumerate(got.cases, 1):
        _check_shard_step(got, number, *case)


def q5_test(got, ref):
    n, dp, m = got.givens.q5
    check_number("activation_factor", got["activation_factor"], 1.0, mistakes=[
        (1 / dp, "ZeRO-3 does not shrink activations: it shards the persistent state, while "
                 "each rank still runs the whole model on its own micro-batch and saves every "
                 "activation of it"),
        (float(dp), "nothing is replicated more under ZeRO-3: each rank saves its own "
                    "micro-batch's activations, as under ZeRO-1"),
        (0.5, "activations are not part of what ZeRO shards, at any stage")])
    check_number("reduce_scatters_per_step", got["reduce_scatters_per_step"], m, mistakes=[
        (1, "one reduce-scatter per step means the first micro-batches' gradients are summed "
            "unsharded, so every rank holds the full gradient (ZeRO-1's memory): keeping "
            "ZeRO-2's saving costs one reduce-scatter per micro-batch"),
        (dp, "the count does not depend on D: one reduce-scatter per micro-batch"),
        (m * dp, "each layer is reduce-scattered once per micro-batch, not once per rank")])
    grad = 2 * n / 1e9
    check_number("deferred_grad_gb", got["deferred_grad_gb"], grad, unit="GB", mistakes=[
        (grad / dp, f"{grad / dp:g} GB is ZeRO-2's gradient slice (2N/D); deferring the "
                    "reduce-scatter to the last micro-batch keeps the full bf16 gradient, 2N "
                    "bytes, on every rank"),
        (2 * grad, "the gradients are bf16: 2 bytes per parameter, not 4"),
        (grad * 1e9, "that is bytes; give GB"),
        (grad * 1e9 / 2**30, "that is GiB; the question asks for GB")])
