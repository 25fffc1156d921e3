"""course_utils.zero.fsdp: ZeroRedundancyOptimizer's uneven shards and FSDP2 fully_shard measured on real
gloo ranks, each against a single-process reference and against the from-scratch ZeRO."""

from __future__ import annotations

import pytest
import torch

from course_utils import launch
from course_utils.zero import fsdp
from course_utils.memory import sizing as memory
from course_utils import zero
from rank_jobs import job, run_jobs

SIZES = [16, 32, 32, 8]
N = sum(zero.unit_sizes(SIZES))  # 1864


def _close_to_reference(params, reference):
    for mine, ref in zip(params, reference):
        torch.testing.assert_close(torch.from_numpy(mine), ref)


@pytest.fixture(scope="module")
def ranks():
    """Every 2-rank run of this file that ends on every rank, in one launch:
    {key: each rank's result}."""
    jobs = {("zro", seed): job(fsdp.zero_redundancy_worker, SIZES, seed, 3) for seed in (0, 1)}
    jobs.update({("fsdp2", raf, seed): job(fsdp.fsdp2_worker, SIZES, seed, raf, 3)
                 for raf in (True, False) for seed in (0, 1)})
    jobs["mp"] = job(fsdp.fsdp2_worker, SIZES, 0, True, 3, 4, 1e-2, True)
    jobs.update({("scratch", stage): job(zero.train_worker, stage, SIZES, 0, 2)
                 for stage in (3, 2)})
    jobs["reduce_dtype"] = job(fsdp.reduce_dtype_worker)
    return dict(zip(jobs, run_jobs(list(jobs.values()), 2, threads_per_rank=None)))


@pytest.fixture(scope="module")
def zro(ranks):
    return {seed: ranks["zro", seed] for seed in (0, 1)}


@pytest.fixture(scope="module")
def fsdp2(ranks):
    out = {(raf, seed): ranks["fsdp2", raf, seed] for raf in (True, False) for seed in (0, 1)}
    out["mp"] = ranks["mp"]
    return out


@pytest.mark.parametrize("seed", [0, 1])
def test_zero_redundancy_optimizer_matches_single_process_adam(zro, seed):
    reference = fsdp.reference_adam(SIZES, seed=seed, dp=2)
    for r in zro[seed]:
        _close_to_reference(r["params"], reference["params"])
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(reference["losses"]))


def test_zero_redundancy_optimizer_shards_whole_parameters_unevenly(zro):
    ranks = zro[0]
    owned = [set(r["owned"]) for r in ranks]
    assert owned[0].isdisjoint(owned[1])
    assert owned[0] | owned[1] == {"0.weight", "0.bias", "2.weight", "2.bias", "4.weight", "4.bias"}
    assert [r["owned_numel"] for r in ranks] == [1024, 840]            # the lecture's figures
    assert [r["adam_bytes"] for r in ranks] == [8192, 6720]            # 8 B x owned params
    assert sum(r["adam_bytes"] for r in ranks) == 8 * N
    # the from-scratch flat buffer splits the same state evenly: 8 B x N / D each
    assert max(r["adam_bytes"] for r in ranks) > 8 * N / 2 == 7456


@pytest.mark.parametrize("raf", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_fsdp2_matches_single_process_adam(fsdp2, raf, seed):
    reference = fsdp.reference_adam(SIZES, seed=seed, dp=2)
    for r in fsdp2[raf, seed]:
        _close_to_reference(r["params"], reference["params"])
        torch.testing.assert_close(torch.tensor(r["losses"]), torch.tensor(reference["losses"]))


@pytest.mark.parametrize("raf", [True, False])
def test_fsdp2_shards_and_persistent_bytes(fsdp2, raf):
    for rank, r in enumerate(fsdp2[raf, 0]):
        assert r["local_shapes"] == {"0.weight": (16, 16), "0.bias": (16,), "2.weight": (16, 32),
                                     "2.bias": (16,), "4.weight": (4, 32), "4.bias": (4,)}
        b = r["bytes"]
        # fp32 weights + fp32 grads + fp32 moments = 16 B per parameter, all sharded over D = 2
        assert (b["weights"], b["grads"], b["master"], b["optimizer"]) == (3728, 3728, 0, 7456)
        persistent = b["weights"] + b["grads"] + b["optimizer"]
        assert persistent == memory.zero_state_bytes(N, 2, 3, "fp32_adam")["total"] == 14912
        # the same total as the from-scratch ZeRO-3 in the lesson's 16-byte layout
        assert persistent == zero.padded_state_bytes(zero.unit_sizes(SIZES), 2, 3)["total"]


def test_reshard_after_forward_true_is_zero3_false_keeps_weights(fsdp2):
    true, false = fsdp2[True, 0][0], fsdp2[False, 0][0]
    assert true["comm_counts"] == {"all_gather": 6, "reduce_scatter": 3}   # like ZeRO-3
    assert false["comm_counts"] == {"all_gather": 3, "reduce_scatter": 3}  # one gather per layer
    assert true["held_after_forward"] == 4 * N // 2 == 3728               # only the fp32 shards
    assert false["held_after_forward"] == 4 * N == 7456                   # full weights kept


def test_from_scratch_gather_counts_match_fsdp2(ranks):
    assert ranks["scratch", 3][0]["comm_counts"]["all_gather"] == 6
    assert ranks["scratch", 2][0]["comm_counts"]["all_gather"] == 3


def test_fsdp2_bf16_close_to_from_scratch_zero3(fsdp2):
    """Same bf16 forward passes; FSDP2 keeps fp32 grads where the 16-byte layout rounds them."""
    ours = zero.reference_train(SIZES, seed=0, dp=2, reduce_dtype="fp32")
    mp = fsdp2["mp"][0]
    assert mp["losses"][:2] == ours["losses"][:2]
    assert [round(v, 4) for v in mp["losses"]] == [round(v, 4) for v in ours["losses"]]
    torch.testing.assert_close(torch.tensor(mp["losses"]), torch.tensor(ours["losses"]),
                               rtol=1e-3, atol=0)
    assert mp["bytes"]["weights"] == 3728  # fp32 shards persist; bf16 copies are transient


def test_fsdp2_rejects_bad_reshard_flag():
    with pytest.raises(launch.RankError, match="reshard_after_forward"):
        launch.run(fsdp.fsdp2_worker, 2, SIZES, 0, "yes", timeout_s=120, show_output=False)


def test_mixed_precision_policy_defaults_and_reduce_dtype(ranks):
    """What lecture 3 states about FSDP2's MixedPrecisionPolicy in the installed torch: the
    defaults change no dtype, and param_dtype=bf16 alone makes the reduce-scatter run in bf16."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    policy = MixedPrecisionPolicy()
    assert (policy.param_dtype, policy.reduce_dtype, policy.output_dtype,
            policy.cast_forward_inputs) == (None, None, None, True)
    for r in ranks["reduce_dtype"]:
        assert r == {"default": ["float32"], "param_dtype=bf16": ["bfloat16"],
                     "param_dtype=bf16, reduce_dtype=fp32": ["float32"]}
