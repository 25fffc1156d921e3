"""Precision: why the 16-byte layout keeps an fp32 master copy, scales fp16 losses and sums
gradients in fp32, each shown on real tensors.

Module 1's layouts (:data:`course_utils.memory.sizing.LAYOUTS`) differ in exactly these choices:

* **16 B/param** (``mixed_adam16``): bf16 weights and gradients, fp32 master copy and moments.
  The master copy exists because an update smaller than half the gap between neighbouring bf16
  numbers is rounded away (:func:`bf16_gap`, :func:`repeated_update`, :func:`fraction_lost`).
* **12 B/param** (``bf16_adam_no_master``): drops the master copy, so those updates are lost.
* **18 B/param** (``mixed_adam_fp32_grads``): keeps gradients in fp32 (2 more bytes) so that
  sums over micro-batches and ranks round once, not at every addition
  (:func:`accumulation_error`; the all-reduce case is
  :func:`course_utils.zero.training.sum_rounding_error`).
* **fp16** has bf16's 2 bytes but a far smaller range: gradients below about 6e-8 flush to zero
  unless the loss is scaled up first (:func:`loss_scaling`, ``torch.amp.GradScaler``), and a
  gradient-norm clip must come after ``unscale_`` (:func:`clip_with_scaler`).
* **fp8** (1 byte) has so little range that every tensor gets its own scale
  (:func:`fp8_cast_error`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from course_utils.runtime.validate import check_bool, check_int, check_real, one_of

__all__ = ["DTYPES", "bf16_gap", "repeated_update", "fraction_lost", "loss_scaling",
           "clip_with_scaler", "fp8_cast_error", "FP8_DTYPES", "accumulation_error"]

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


BF16_MIN_NORMAL = 2.0 ** -126  # below it bf16 is subnormal: a fixed spacing of 2^-133
BF16_MAX = (2 - 2 ** -7) * 2.0 ** 127


def bf16_gap(x: float) -> float:
    """Spacing of bf16 numbers at ``x`` (0 < x <= bf16's largest finite value): the distance
    from the largest bf16 number <= x to the next one. 2^(floor(log2 x) - 7) for normal
    numbers (7 stored fraction bits); 2^-133 for subnormals (x < 2^-126)."""
    x = check_real("x", x)
    if x > BF16_MAX:
        raise ValueError(f"x must be at most bf16's largest finite value {BF16_MAX:.4g}, got {x!r}")
    return 2.0 ** (math.floor(math.log2(max(x, BF16_MIN_NORMAL))) - 7)


def repeated_update(start: float = 1.0, update: float = 1e-3, steps: int = 100) -> dict[str, float]:
    """Add ``update`` to a weight ``steps`` times: once to a bf16 weight directly (12-byte
    layout), once to an fp32 master copy rounded to bf16 after each step (16-byte layout)."""
    start, update = check_real("start", start), check_real("update", update)
    check_int("steps", steps)
    weight = torch.tensor(start, dtype=torch.bfloat16)         # () the bf16 weight, no master
    master = torch.tensor(start, dtype=torch.float32)          # () the fp32 master copy
    step = torch.tensor(update, dtype=torch.float32)
    for _ in range(steps):
        weight = (weight.float() + step).bfloat16()            # the sum rounds back to bf16
        master = master + step
    return {"exact": start + steps * update, "bf16 only": weight.item(),
            "fp32 master": master.item(), "bf16 copy of master": master.bfloat16().item()}


def fraction_lost(update: float, weight_std: float = 0.02, numel: int = 100_000,
                  seed: int = 0) -> float:
    """Fraction of a bf16 weight tensor (normal, std ``weight_std``) that does not change at
    all when ``update`` (times a random sign, as Adam's steps are about lr in size) is added."""
    update = check_real("update", update)
    weight_std = check_real("weight_std", weight_std)
    check_int("numel", numel)
    check_int("seed", seed, 0)
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(numel, generator=g) * weight_std).bfloat16()           # (numel,)
    sign = torch.randint(0, 2, (numel,), generator=g).float() * 2 - 1       # (numel,) +-1
    new = (w.float() + update * sign).bfloat16()                            # (numel,)
    return (new == w).float().mean().item()


def loss_scaling(loss_weight: float = 1e-4, input_scale: float = 1e-4, numel: int = 1000,
                 init_scale: float = 2.0**16, seed: int = 0) -> dict[str, float]:
    """One backward of ``loss_weight * sum(w * x)`` computed in fp16 (fp32 master ``w``, fp16
    inputs ``x`` of size ``input_scale``), without and with ``torch.amp.GradScaler``.

    Returns the fp32 reference gradient's mean magnitude, the fraction of gradient elements
    that came out exactly zero without scaling, the error with scaling as max|error| / max|g|
    (the largest error against the largest gradient: ``"max relative error with scaling"``), and
    whether the scaled step was taken (no inf/nan) with the scale after ``update()``.
    """
    loss_weight = check_real("loss_weight", loss_weight)
    input_scale = check_real("input_scale", input_scale)
    init_scale = check_real("init_scale", init_scale)
    check_int("numel", numel)
    check_int("seed", seed, 0)
    g = torch.Generator().manual_seed(seed)
    w0 = torch.randn(numel, generator=g)                                    # (numel,) fp32 master
    x = (torch.randn(numel, generator=g) * input_scale).half()              # (numel,) fp16

    def run(scaler: torch.amp.GradScaler | None) -> tuple[torch.Tensor, dict[str, Any]]:
        w = w0.clone().requires_grad_(True)
        opt = torch.optim.SGD([w], lr=0.0)          # lr 0: only the gradient matters here
        loss = (w.half() * x).float().sum() * loss_weight      # fp16 product, fp32 loss
        info: dict[str, Any] = {}
        if scaler is None:
            loss.backward()
        else:
            scaler.scale(loss).backward()           # loss x scale: the fp16 gradients grow
            scaler.unscale_(opt)                    # fp32 gradients / scale, inf/nan check
            scaler.step(opt)                        # skipped if any gradient was inf/nan
            info["scale before"] = scaler.get_scale()
            scaler.update()
            info["scale after"] = scaler.get_scale()
        return w.grad.detach().clone(), info

    exact = (x.float() * loss_weight).double()                              # (numel,) d loss / d w
    plain, _ = run(None)
    scaled, info = run(torch.amp.GradScaler("cpu", init_scale=init_scale))
    finite = bool(torch.isfinite(scaled).all())
    rel = ((scaled.double() - exact).abs().max() / exact.abs().max()).item() if finite \
        else float("inf")
    return {"mean |gradient|": exact.abs().mean().item(),
            "zero without scaling": (plain == 0).double().mean().item(),
            "max relative error with scaling": rel,
            "step taken": info["scale after"] >= info["scale before"],
            "scale before": info["scale before"], "scale after": info["scale after"]}


def clip_with_scaler(max_norm: float = 1.0, init_scale: float = 2.0**16, numel: int = 1000,
                     seed: int = 0) -> dict[str, float]:
    """Clip a gradient to ``max_norm`` beside ``torch.amp.GradScaler``, after ``unscale_`` (as
    PyTorch's AMP recipe says) and before it, and return what each clip saw and did.

    The gradient is that of ``sum(w * x)``, x ~ N(0, 1): norm about sqrt(numel), above
    ``max_norm``. SGD with lr 1 makes the step equal to the clipped gradient, so the returned
    step norms say what each order does: ``max_norm`` when clipped after ``unscale_``; when
    clipped before it, the clip saw the scaled gradient, and unscaling then shrank the already
    clipped gradient by ``init_scale`` as well."""
    max_norm = check_real("max_norm", max_norm)
    init_scale = check_real("init_scale", init_scale)
    check_int("numel", numel)
    check_int("seed", seed, 0)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed))   # (numel,)
    out: dict[str, float] = {}
    for order in ("after unscale_", "before unscale_"):
        w = torch.zeros(numel, requires_grad=True)
        opt = torch.optim.SGD([w], lr=1.0)
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale)
        scaler.scale((w * x).sum()).backward()              # w.grad = x * scale
        if order == "before unscale_":
            seen = torch.nn.utils.clip_grad_norm_([w], max_norm)
            scaler.unscale_(opt)
        else:
            scaler.unscale_(opt)                            # w.grad = x
            seen = torch.nn.utils.clip_grad_norm_([w], max_norm)
        scaler.step(opt)
        scaler.update()
        out[f"norm seen, clipped {order}"] = seen.item()
        out[f"step norm, clipped {order}"] = w.detach().norm().item()
    out["true gradient norm"] = x.norm().item()
    return out


FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def fp8_cast_error(std: float = 1e-3, numel: int = 100_000, fmt: str = "e4m3",
                   scaled: bool = True, outlier: float | None = None,
                   seed: int = 0) -> dict[str, float]:
    """Round a tensor (normal, ``std``; element 0 set to ``outlier`` if given) to fp8 and back,
    without a scale or with a per-tensor scale (largest finite fp8 value / amax, the "current
    scaling" recipe). Returns the fraction of the other elements that became zero and their mean
    relative error |rounded - x| / |x|."""
    std = check_real("std", std)
    check_int("numel", numel, 2)
    dtype = one_of("fmt", fmt, FP8_DTYPES)
    check_bool("scaled", scaled)
    if outlier is not None:
        outlier = check_real("outlier", outlier)
    check_int("seed", seed, 0)
    x = torch.randn(numel, generator=torch.Generator().manual_seed(seed)) * std  # (numel,)
    if outlier is not None:
        x[0] = outlier
    scale = torch.finfo(dtype).max / x.abs().max() if scaled else torch.tensor(1.0)
    back = (x * scale).to(dtype).float() / scale                            # (numel,)
    rest, x_rest = back[1:], x[1:]
    return {"scale": scale.item(), "zero": (rest == 0).float().mean().item(),
            "mean relative error": ((rest - x_rest).abs() / x_rest.abs()).mean().item()}


def accumulation_error(n_micro: int, grad_dtype: str = "bf16", features: int = 64,
                       batch: int = 8, seed: int = 0) -> float:
    """Relative error of a gradient accumulated over ``n_micro`` micro-batches in ``grad_dtype``.

    A bf16 ``Linear(features, features)`` computes each micro-batch's weight gradient with
    autograd (in bf16); the gradients are added one after another into a ``grad_dtype`` buffer
    (bf16: each addition rounds, as a bf16 ``.grad`` does; fp32: the 18-byte layout), the sum is
    divided by ``n_micro`` and stored as bf16. Returns mean |result - exact| / mean |exact|, the
    exact mean computed in float64 from the same bf16 micro-batch gradients.
    """
    check_int("n_micro", n_micro)
    check_int("features", features)
    check_int("batch", batch)
    check_int("seed", seed, 0)
    acc_dtype = one_of("grad_dtype", grad_dtype, {k: DTYPES[k] for k in ("bf16", "fp32")})
    g = torch.Generator().manual_seed(seed)
    weight = (torch.randn(features, features, generator=g) / features**0.5).bfloat16()
    weight.requires_grad_(True)                                             # (F, F) bf16
    acc = torch.zeros(features, features, dtype=acc_dtype)                 # the .grad buffer
    exact = torch.zeros(features, features, dtype=torch.float64)
    for _ in range(n_micro):
        x = torch.randn(batch, features, generator=g).bfloat16()           # (batch, F)
        target = torch.randn(batch, features, generator=g).bfloat16()      # (batch, F)
        loss = ((x @ weight.T).float() - target.float()).pow(2).mean()
        (grad,) = torch.autograd.grad(loss, weight)                        # (F, F) bf16
        acc = acc + grad.to(acc_dtype)                                      # rounds to acc_dtype
        exact = exact + grad.double()
    mean = (acc / n_micro).bfloat16().double()
    exact = exact / n_micro
    return ((mean - exact).abs().mean() / exact.abs().mean()).item()


# --------------------------------------------------------------------- one number, bit by bit

FORMATS = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
           "fp8 e4m3": torch.float8_e4m3fn, "fp8 e5m2": torch.float8_e5m2}
FIELDS = {"fp32": (8, 23), "bf16": (8, 7), "fp16": (5, 10), "fp8 e4m3": (4, 3),
          "fp8 e5m2": (5, 2)}  # (exponent bits, fraction bits); one sign bit before them
_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _stored(x: float, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64).to(dtype)  # () rounded by torch's cast


def _bits(t: torch.Tensor) -> int:
    """The bit pattern of a 0-d tensor, as an unsigned int."""
    n = t.element_size()
    return t.view(_AS_INT[n]).item() & (2 ** (8 * n) - 1)


def _from_bits(raw: int, dtype: torch.dtype) -> float:
    """The number whose bit pattern is ``raw`` (unsigned) in ``dtype``."""
    n = torch.empty((), dtype=dtype).element_size()
    signed = raw - 2 ** (8 * n) if n > 1 and raw >= 2 ** (8 * n - 1) else raw
    return torch.tensor(signed, dtype=_AS_INT[n]).view(dtype).to(torch.float64).item()


def represent(x: float, fmt: str = "bf16") -> dict[str, Any]:
    """``x`` stored in ``fmt`` (one of :data:`FORMATS`) by torch's cast: the value stored, its
    bits split into sign, exponent and fraction (:data:`FIELDS`), the gap from it to the next
    number of the format further from zero (None when there is none: past the largest finite
    value, inf or nan), the rounding error stored - x, the format's largest finite number and
    whether |x| is past it (``overflow``: fp16 and fp8 e5m2 then store inf; fp8 e4m3 has no
    inf, torch's cast saturates at 448)."""
    x = check_real("x", x, None)
    dtype = one_of("fmt", fmt, FORMATS)
    t = _stored(x, dtype)
    stored = t.to(torch.float64).item()
    raw, n = _bits(t), 8 * t.element_size()
    bits = format(raw, f"0{n}b")
    exponent, fraction = FIELDS[fmt]
    gap = None
    if math.isfinite(stored) and raw + 1 < 2 ** n:
        up = _from_bits(raw + 1, dtype)  # the next pattern: one step further from zero
        if math.isfinite(up) and abs(up) > abs(stored):
            gap = abs(up) - abs(stored)
    largest = float(torch.finfo(dtype).max)
    return {"format": fmt, "x": x, "stored": stored, "sign": bits[0],
            "exponent": bits[1:1 + exponent], "fraction": bits[1 + exponent:], "gap": gap,
            "error": stored - x if math.isfinite(stored) else math.inf, "largest": largest,
            "overflow": abs(x) > largest}


def update_lost(weight: float, update: float, fmt: str = "bf16") -> dict[str, Any]:
    """Add ``update`` to ``weight`` stored in ``fmt`` as :func:`repeated_update` adds it to a
    bf16 weight (in fp32, the sum rounded back to ``fmt``): the weight before and after, and
    whether the update was lost (the stored weight did not change)."""
    weight, update = check_real("weight", weight, None), check_real("update", update, None)
    dtype = one_of("fmt", fmt, FORMATS)
    before = _stored(weight, dtype)
    after = (before.float() + torch.tensor(update, dtype=torch.float32)).to(dtype)  # ()
    b, a = before.to(torch.float64).item(), after.to(torch.float64).item()
    return {"before": b, "after": a, "lost": a == b}


__all__ += ["FORMATS", "FIELDS", "represent", "update_lost"]
