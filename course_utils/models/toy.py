"""Toy models: the one seeded builder of the small Linear stacks the lectures train.

Data parallelism (lecture 2, a10's broken programs), the activation and replica-state
measurements (1, 9), the pipeline (5), ZeRO (3) and checkpointing (12) all train a small MLP
whose every rank, and the one-process reference, must start from the same weights.
:func:`toy_mlp` builds it from its layer widths and a seed (PyTorch's default ``nn.Linear``
initialisation, drawn from ``seed``); :func:`seeded` is that seeding for any other module
built inside it (the tiny LM, a transformer layer), the caller's random stream left as it was.
"""

from __future__ import annotations

import contextlib
import numbers
from typing import Iterator, Sequence

import torch
from torch import nn

from course_utils.runtime import validate

__all__ = ["ACTIVATIONS", "seeded", "toy_mlp"]

ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "gelu": nn.GELU}
"""The activations :func:`toy_mlp` puts after its Linear layers, by name."""


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Inside: torch's CPU random stream starts from ``seed`` (what ``torch.manual_seed`` sets),
    so a module built inside gets the same weights on every rank; after: the caller's stream
    is back where it was. ``seed``: an int (ValueError naming it otherwise)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise ValueError(f"seed must be an int; got {seed!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def toy_mlp(sizes: Sequence[int], *, seed: int, activation: str = "tanh",
            final_activation: bool = False, dropout: float | None = None,
            dtype: torch.dtype | None = None) -> nn.Sequential:
    """``nn.Sequential(Linear(sizes[0], sizes[1]), act, ..., Linear(sizes[-2], sizes[-1]))``
    with the weights ``seed`` gives (every rank and the reference build the same ones).

    ``activation``: a name of :data:`ACTIVATIONS`, after each Linear but the last (after the
    last too with ``final_activation``); ``dropout``: an ``nn.Dropout(dropout)`` after each
    activation between two Linears (None: none); ``dtype``: the parameters' dtype (None:
    float32). Each Linear keeps its bias.
    """
    sizes = validate.check_ints("sizes", sizes, 1, min_len=2)
    act = validate.one_of("activation", activation, ACTIVATIONS)
    validate.check_bool("final_activation", final_activation)
    if dropout is not None:
        validate.check_real("dropout", dropout, 0, strict=False, maximum=1)
    layers: list[nn.Module] = []
    with seeded(seed):
        for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(nn.Linear(fan_in, fan_out))
            last = i == len(sizes) - 2
            if not last or final_activation:
                layers.append(act())
            if not last and dropout is not None:
                layers.append(nn.Dropout(dropout))
    model = nn.Sequential(*layers)
    return model if dtype is None else model.to(dtype)
