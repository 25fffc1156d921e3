"""Vocabulary parallelism: the split embedding and the cross-entropy from split logits equal
``nn.Embedding`` and ``F.cross_entropy`` on one process, on 2, 3 and 4 real ranks, two seeds."""

from __future__ import annotations

import functools

import pytest
import torch

from course_utils import launch
from course_utils.tensor_parallel import vocab as vocab_parallel


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_split_embedding_and_loss_equal_one_process(world_size, seed):
    for diffs in launch.run(functools.partial(vocab_parallel.check_worker, seed=seed),
                            world_size, timeout_s=60):
        assert max(diffs.values()) < 2e-6, diffs


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="logits must be"):
        vocab_parallel.vocab_parallel_cross_entropy(torch.zeros(3, 4),
                                                    torch.zeros(2, dtype=torch.long))
