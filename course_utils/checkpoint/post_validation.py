"""Post-validation with AdamW (Qi et al. 2023, section 4): roll back in place or from a kept copy.

Pipeline stages step the optimizer at once instead of waiting for the global gradient norm; the
last stage's whole norm comes back later, and a stage whose clipping factor was wrong rolls back
and steps again. Two ways to roll back, both here on plain tensors in one process:

* In place (Qi et al.'s ``rollback_adamw``, sail-sg/zero-bubble-pipeline-parallelism,
  ``megatron/core/optimizer/zbpp_optimizer_helper.py``): invert the AdamW step from the new
  moments and the gradient, keeping no copy. Not bit exact: float rounding.
* From a kept copy (:class:`KeptCopy`: weights and both moments, 12 bytes per fp32 parameter;
  their ``--enable-exactly-numeric-match`` does this, ``save_parameters_backup``): exact.

:func:`adamw_step` is ``torch.optim.AdamW``'s single-tensor path written out op for op
(``torch/optim/adam.py``, ``_single_tensor_adam`` with ``decoupled_weight_decay=True``), so it
equals torch bit for bit. :func:`post_validation_run` runs the step on a small model cut into P
stages, with both ways (and a third that never rolls back), against ``clip_grad_norm_`` +
``torch.optim.AdamW`` in one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from course_utils.pipeline.runtime import make_batch, make_model, split_stages
from course_utils.runtime.validate import check_int, check_real, one_of

__all__ = ["AdamWState", "adamw_step", "adamw_rollback", "KeptCopy", "clip_coef",
           "adamw_reference", "post_validation_run", "WAYS", "POLICIES"]

WAYS = ("in_place", "kept_copy", "no_rollback")
# When may a stage step before the whole norm is known?
POLICIES = {
    "qi": "only while its partial norm needs no clipping; it steps unclipped (factor 1), as "
          "Qi et al.'s can_local_step; otherwise it waits for the whole norm",
    "partial": "always, with the factor its partial norm gives (the course's SGD version)",
}


@dataclass
class AdamWState:
    """AdamW's state for a list of parameters: the step count (one for all) and both moments."""
    step: int
    exp_avg: list[torch.Tensor]
    exp_avg_sq: list[torch.Tensor]

    @classmethod
    def zeros(cls, params: Sequence[torch.Tensor]) -> AdamWState:
        return cls(0, [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params])


def _hyper(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], state: Any, lr: Any,
           betas: Any, eps: Any, weight_decay: Any, coef: Any) -> tuple[float, float]:
    """Check the arguments (ValueError naming the bad one); return (beta1, beta2)."""
    if not isinstance(state, AdamWState) or len(state.exp_avg) != len(params) \
            or len(state.exp_avg_sq) != len(params):
        raise ValueError(f"state must be an AdamWState for the {len(params)} params")
    if len(grads) != len(params):
        raise ValueError(f"grads must be one per param ({len(params)}); got {len(grads)}")
    check_real("coef", coef)
    return _check_hyper(lr, betas, eps, weight_decay)


def _check_hyper(lr: Any, betas: Any, eps: Any, weight_decay: Any) -> tuple[float, float]:
    lr = check_real("lr", lr)
    if not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise ValueError(f"betas must be a pair (beta1, beta2); got {betas!r}")
    for i, b in enumerate(betas):  # > 0: the rollback divides by each beta
        check_real(f"betas[{i}]", b, 0, maximum=1)
    check_real("eps", eps, strict=False)
    if check_real("weight_decay", weight_decay, strict=False) * lr >= 1.0:
        raise ValueError(f"weight_decay * lr must be < 1; got {weight_decay!r} * {lr!r}")
    return float(betas[0]), float(betas[1])


@torch.no_grad()
def adamw_step(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], state: AdamWState,
               lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 1e-2, coef: float = 1.0) -> None:
    """One AdamW step in place on the gradients times ``coef`` (the clipping factor), the ops of
    torch's ``_single_tensor_adam``:

        p *= 1 - lr*wd;  m = lerp(m, g, 1 - b1);  v = b2*v + (1 - b2)*g*g;  t += 1
        p -= lr / (1 - b1**t) * m / (sqrt(v) / sqrt(1 - b2**t) + eps)
    """
    beta1, beta2 = _hyper(params, grads, state, lr, betas, eps, weight_decay, coef)
    state.step += 1
    step_size = lr / (1 - beta1 ** state.step)
    bc2_sqrt = (1 - beta2 ** state.step) ** 0.5
    for p, g, m, v in zip(params, grads, state.exp_avg, state.exp_avg_sq):
        g = g * coef
        if weight_decay != 0:
            p.mul_(1 - lr * weight_decay)  # decoupled: before the moments, on the old weights
        m.lerp_(g, 1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v.sqrt() / bc2_sqrt).add_(eps)  # eps outside the root, after bias correction
        p.addcdiv_(m, denom, value=-step_size)


@torch.no_grad()
def adamw_rollback(params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                   state: AdamWState, lr: float = 1e-3, betas: Sequence[float] = (0.9, 0.999),
                   eps: float = 1e-8, weight_decay: float = 1e-2, coef: float = 1.0) -> None:
    """Undo the last :func:`adamw_step` (same arguments) in place, keeping no copy.

    The update is rebuilt from the new moments and the step count before it goes back:
    ``p = (p_new + lr / (1 - b1**t) * m / denom) / (1 - lr*wd)``, then
    ``v = (v - (1 - b2)*g*g) / b2``, ``m = (m - (1 - b1)*g) / b1``, ``t -= 1``. Equal to the
    old state up to float rounding (a few ulps), not bit for bit.
    """
    beta1, beta2 = _hyper(params, grads, state, lr, betas, eps, weight_decay, coef)
    if state.step < 1:
        raise ValueError(f"state must have taken a step to roll back; step={state.step}")
    step_size = lr / (1 - beta1 ** state.step)
    bc2_sqrt = (1 - beta2 ** state.step) ** 0.5
    for p, g, m, v in zip(params, grads, state.exp_avg, state.exp_avg_sq):
        g = g * coef
        denom = (v.sqrt() / bc2_sqrt).add_(eps)
        p.addcdiv_(m, denom, value=step_size)
        if weight_decay != 0:
            p.div_(1 - lr * weight_decay)
        # rounding can leave v a hair below 0 where it was ~0; sqrt would give NaN next step
        # (Qi et al.'s rollback_adamw does not clamp)
        v.addcmul_(g, g, value=-(1 - beta2)).div_(beta2).clamp_min_(0)
        m.add_(g, alpha=-(1 - beta1)).div_(beta1)
    state.step -= 1


class KeptCopy:
    """Roll back by restoring copies of the weights and both moments taken before the step."""

    def __init__(self, params: Sequence[torch.Tensor], state: AdamWState):
        self.step = state.step
        self.tensors = [t.detach().clone() for t in (*params, *state.exp_avg, *state.exp_avg_sq)]

    @property
    def nbytes(self) -> int:
        """Bytes held: 12 per fp32 parameter (weight, exp_avg, exp_avg_sq)."""
        return sum(t.numel() * t.element_size() for t in self.tensors)

    @torch.no_grad()
    def restore(self, params: Sequence[torch.Tensor], state: AdamWState) -> None:
        for dst, src in zip((*params, *state.exp_avg, *state.exp_avg_sq), self.tensors):
            dst.copy_(src)
        state.step = self.step


def clip_coef(norms: Sequence[torch.Tensor], max_norm: float) -> tuple[float, float]:
    """(factor, norm) from per-tensor gradient norms, ``clip_grad_norm_``'s ops: the norm of the
    norms, then ``min(1, max_norm / (norm + 1e-6))`` in float32. Stages that pass the norms so
    far (one number per tensor) get bit for bit torch's factor at the last stage; Megatron passes
    one sum of squares, equal up to rounding."""
    check_real("max_norm", max_norm)
    if len(norms) == 0:
        raise ValueError("norms must hold at least one norm")
    total = torch.linalg.vector_norm(torch.stack(list(norms)), 2.0)
    return torch.clamp(max_norm / (total + 1e-6), max=1.0).item(), total.item()


def _batch(seed: int, s: int, batch: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    return make_batch(1000 * seed + s, batch, width)


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([q.detach().reshape(-1) for q in model.parameters()])


def adamw_reference(steps: int = 3, max_norm: float = 0.12, lr: float = 1e-2,
                    betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                    weight_decay: float = 0.1, seed: int = 0, batch: int = 12, width: int = 16,
                    depth: int = 4) -> torch.Tensor:
    """In order, one process: ``clip_grad_norm_`` then ``torch.optim.AdamW`` each step; the final
    weights, flat (the first step imports torch._dynamo: a second or two)."""
    model = make_model(seed, width, depth)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=tuple(betas), eps=eps,
                            weight_decay=weight_decay, foreach=False)
    for s in range(steps):
        x, y = _batch(seed, s, batch, width)
        opt.zero_grad()
        nn.functional.mse_loss(model(x), y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        opt.step()
    return _flat(model)


def _validated_step(stages: list[list[torch.Tensor]], grads: list[list[torch.Tensor]],
                    states: list[AdamWState], max_norm: float, hyper: dict, policy: str,
                    way: str) -> dict:
    """One step, stage by stage in order, then the validation coming back."""
    so_far: list[torch.Tensor] = []
    used: list[float | None] = []
    kept: list[KeptCopy | None] = []
    for params, g, st in zip(stages, grads, states):  # forward: the norms so far travel on
        so_far += [torch.linalg.vector_norm(t, 2.0) for t in g]
        coef, _ = clip_coef(so_far, max_norm)
        eager = coef == 1.0 or policy == "partial"
        kept.append(KeptCopy(params, st) if eager and way == "kept_copy" else None)
        if eager:
            adamw_step(params, g, st, coef=coef, **hyper)
        used.append(coef if eager else None)
    right, norm = clip_coef(so_far, max_norm)  # the last stage's partial is the whole norm
    rollbacks = 0
    for params, g, st, u, k in zip(stages, grads, states, used, kept):  # back it goes
        if u == right or (u is not None and way == "no_rollback"):
            continue
        if u is not None:  # validation failed: undo the eager step
            rollbacks += 1
            if way == "in_place":
                adamw_rollback(params, g, st, coef=u, **hyper)
            else:
                k.restore(params, st)
        adamw_step(params, g, st, coef=right, **hyper)
    return {"norm": norm, "coef": right, "rollbacks": rollbacks,
            "eager": sum(u is not None for u in used),
            "extra_bytes": sum(k.nbytes for k in kept if k is not None),
            "copied": sum(t.numel() for ps, k in zip(stages, kept) if k is not None for t in ps)}


def post_validation_run(p: int = 4, steps: int = 3, max_norm: float = 0.12, lr: float = 1e-2,
                        betas: Sequence[float] = (0.9, 0.999), eps: float = 1e-8,
                        weight_decay: float = 0.1, policy: str = "qi", seed: int = 0,
                        batch: int = 12, width: int = 16, depth: int = 4) -> dict:
    """``steps`` AdamW steps with gradient clipping on ``make_model`` cut into ``p`` stages, the
    global check done by post-validation, each of :data:`WAYS`, in one process.

    The default ``max_norm`` lies below the whole gradient norm (about 0.25-0.3) and above the
    first stage's partial norm (about 0.1), so stages step eagerly and roll back every step.
    Returns ``{"reference": flat weights, "norms": whole norm per step, "ways": {way: {"weights",
    "max_abs_diff" (from the reference), "extra_bytes" (most held at once beyond AdamW's state),
    "extra_bytes_per_param" (of the parameters copied), "rollbacks", "eager_steps"}}}``.
    """
    check_int("p", p)
    check_int("steps", steps)
    check_int("seed", seed, 0)
    one_of("policy", policy, POLICIES)
    check_real("max_norm", max_norm)
    _check_hyper(lr, betas, eps, weight_decay)
    hyper = {"lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay}
    ref = adamw_reference(steps, max_norm, seed=seed, batch=batch, width=width, depth=depth,
                          **hyper)
    out: dict = {"reference": ref, "norms": [], "ways": {}}
    for way in WAYS:
        model = make_model(seed, width, depth)
        stages = [list(st.parameters()) for st in split_stages(model, p)]
        states = [AdamWState.zeros(ps) for ps in stages]
        rows = []
        for s in range(steps):
            x, y = _batch(seed, s, batch, width)
            model.zero_grad()
            nn.functional.mse_loss(model(x), y).backward()
            grads = [[q.grad.detach().clone() for q in ps] for ps in stages]
            rows.append(_validated_step(stages, grads, states, max_norm, hyper, policy, way))
        if way == "kept_copy":  # the way whose weights are the reference's, bit for bit
            out["norms"] = [r["norm"] for r in rows]
        flat = _flat(model)
        worst = max(rows, key=lambda r: r["extra_bytes"])
        extra = worst["extra_bytes"]
        out["ways"][way] = {"weights": flat, "max_abs_diff": (flat - ref).abs().max().item(),
                            "extra_bytes": extra,
                            "extra_bytes_per_param": extra / max(worst["copied"], 1),
                            "rollbacks": sum(r["rollbacks"] for r in rows),
                            "eager_steps": sum(r["eager"] for r in rows)}
    return out
