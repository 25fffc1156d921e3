"""The backward pass split in two: the input gradient (I) now, the weight gradient (W) later.

For a linear layer y = x W^T + b with the gradient g = dL/dy arriving from the layer above:

* I, the input gradient: dL/dx = g W, shape (n, in). The layer below waits for it, so the
  pipeline cannot move on until it is done;
* W, the weight gradient: dL/dW = g^T x and dL/db = the sum of g over the n rows. Nothing else
  reads it before the optimizer step, so it can wait, as long as g and x are kept.

Each is one matmul the size of the forward's (2 n in out floating-point operations), which is
why Qi et al. (2023, section 2) take T_F = T_B = T_W as their model. Three ways to compute
them, checked against each other and the full backward in ``tests/test_zero_bubble.py``:

* by hand (:func:`linear_input_grad`, :func:`linear_weight_grad`);
* with autograd, as two calls (:func:`autograd_split`): ``torch.autograd.grad`` for the input
  alone (autograd then skips the weight matmul), then for the weights from the retained graph;
* :class:`SplitStage`: a pipeline stage of ``Linear -> Tanh`` blocks whose forward, I and W are
  written out by hand and keep exactly the tensors each later part needs (what the course's
  ZB-H1 on real ranks runs, :mod:`course_utils.pipeline.zero_bubble_runtime`).
"""

from __future__ import annotations

import torch
from torch import nn

from course_utils.runtime.validate import check_int

__all__ = ["linear_input_grad", "linear_weight_grad", "full_backward", "autograd_split",
           "matmul_flops", "SplitStage"]


def linear_input_grad(grad_out: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """I of a linear layer: dL/dx = grad_out @ weight, (n, out) @ (out, in) -> (n, in)."""
    return grad_out @ weight


def linear_weight_grad(grad_out: torch.Tensor,
                       x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """W of a linear layer: (dL/dW, dL/db) = (grad_out^T @ x, grad_out summed over rows),
    shapes (out, in) and (out,)."""
    return grad_out.T @ x, grad_out.sum(0)


def full_backward(layer: nn.Linear, x: torch.Tensor,
                  grad_out: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One ``backward`` call: (dL/dx, [dL/dW, dL/db]) as a training step computes them."""
    x = x.detach().requires_grad_(True)
    layer.zero_grad(set_to_none=True)
    layer(x).backward(grad_out)
    return x.grad, [layer.weight.grad, layer.bias.grad]


def autograd_split(layer: nn.Linear, x: torch.Tensor,
                   grad_out: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The same gradients from two autograd calls: I first (the graph kept for later), W after."""
    x = x.detach().requires_grad_(True)
    y = layer(x)
    (dx,) = torch.autograd.grad(y, x, grad_out, retain_graph=True)  # I: input only
    dw, db = torch.autograd.grad(y, (layer.weight, layer.bias), grad_out)  # W, later
    return dx, [dw, db]


def matmul_flops(n: int, d_in: int, d_out: int) -> dict[str, int]:
    """Floating-point operations of a linear layer's F, I and W for n rows: 2 n d_in d_out each."""
    for name, value in (("n", n), ("d_in", d_in), ("d_out", d_out)):
        check_int(name, value)
    flops = 2 * n * d_in * d_out
    return {"F": flops, "I": flops, "W": flops}


class SplitStage:
    """A stage of ``Linear -> Tanh`` blocks with its forward, I and W written out by hand.

    ``forward(mb, x)`` keeps the stage input and each block's output; ``backward_input(mb, g)``
    returns dL/d(input) and keeps, for W, each linear's input and the gradient of its output;
    ``backward_weight(mb)`` adds the weight gradients into ``.grad`` and frees the microbatch.
    :meth:`held_bytes` is what the kept tensors take now (the course's measure of activation
    memory), :attr:`peak_bytes` its largest value so far.
    """

    def __init__(self, stage: nn.Sequential):
        self.blocks = []
        for block in stage:
            if not (isinstance(block, nn.Sequential) and len(block) == 2
                    and isinstance(block[0], nn.Linear) and isinstance(block[1], nn.Tanh)):
                raise ValueError("stage must be an nn.Sequential of (Linear, Tanh) blocks, got "
                                 f"{block!r}")
            self.blocks.append(block[0])
        self.after_forward: dict[int, list[torch.Tensor]] = {}  # mb -> [x, y_1, ..., y_k]
        self.for_weights: dict[int, tuple[list, list]] = {}     # mb -> (inputs, grads of z)
        self.peak_bytes = 0

    def held_bytes(self) -> int:
        """Bytes of the tensors kept for a later I or W (a tensor kept twice counts once)."""
        seen: dict[int, int] = {}
        for kept in self.after_forward.values():
            for t in kept:
                seen[t.data_ptr()] = t.numel() * t.element_size()
        for inputs, dzs in self.for_weights.values():
            for t in [*inputs, *dzs]:
                seen[t.data_ptr()] = t.numel() * t.element_size()
        return sum(seen.values())

    def _note(self) -> None:
        self.peak_bytes = max(self.peak_bytes, self.held_bytes())

    @torch.no_grad()
    def forward(self, mb: int, x: torch.Tensor) -> torch.Tensor:
        """F: y_j = tanh(y_{j-1} W_j^T + b_j); keeps x and every y_j."""
        kept = [x]
        for linear in self.blocks:
            kept.append(torch.tanh(nn.functional.linear(kept[-1], linear.weight, linear.bias)))
        self.after_forward[mb] = kept
        self._note()
        return kept[-1]

    @torch.no_grad()
    def backward_input(self, mb: int, grad_out: torch.Tensor) -> torch.Tensor:
        """I: through each block from the top, dz_j = g (1 - y_j^2), g = dz_j W_j; keeps each
        dz_j and linear input y_{j-1} for W, drops the rest; returns dL/dx."""
        kept = self.after_forward.pop(mb)
        g, dzs = grad_out, []
        for j in range(len(self.blocks), 0, -1):
            dz = g * (1 - kept[j] ** 2)  # tanh' from its output
            g = linear_input_grad(dz, self.blocks[j - 1].weight)
            dzs.insert(0, dz)
        self.for_weights[mb] = (kept[:-1], dzs)  # the stage's output is no longer needed
        self._note()
        return g

    @torch.no_grad()
    def backward_weight(self, mb: int) -> None:
        """W: each linear's dL/dW = dz^T y_{j-1}, dL/db = sum of dz, added into ``.grad``."""
        inputs, dzs = self.for_weights.pop(mb)
        for linear, a, dz in zip(self.blocks, inputs, dzs):
            dw, db = linear_weight_grad(dz, a)
            for param, grad in ((linear.weight, dw), (linear.bias, db)):
                param.grad = grad.clone() if param.grad is None else param.grad + grad
