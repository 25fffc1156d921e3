"""course_utils.models.tiny_lm: the model's shapes and causality, the Markov corpus, sharding, bad
input, and the figures notebook 07 states (parameter count, loss floor); the toy MLPs of
course_utils.models.toy and the argument checks of course_utils.runtime.validate."""

from __future__ import annotations

import math

import pytest
import torch

from course_utils.models import tiny_lm, toy
from course_utils.models.tiny_lm import MarkovCorpus, TinyLMConfig
from course_utils.runtime import validate


@pytest.mark.parametrize("cfg", [TinyLMConfig(), TinyLMConfig(vocab_size=10, seq_len=5, d_model=8,
                                                              n_heads=2, n_layers=3, d_ff=12)])
def test_param_count_matches_formula(cfg):
    assert tiny_lm.count_params(tiny_lm.build(cfg)) == tiny_lm.predicted_param_count(cfg)


def test_notebook_figures():
    cfg = TinyLMConfig()
    assert tiny_lm.count_params(tiny_lm.build(cfg)) == 110_400
    assert round(MarkovCorpus(64, 4, 0).entropy_rate(), 3) == 1.351
    assert round(tiny_lm.uniform_loss(cfg), 3) == round(math.log(64), 3) == 4.159


def test_forward_shape_and_causality():
    cfg = TinyLMConfig()
    model = tiny_lm.build(cfg, seed=1)
    x = torch.randint(cfg.vocab_size, (3, cfg.seq_len))
    logits = model(x)
    assert logits.shape == (3, cfg.seq_len, cfg.vocab_size)
    y = x.clone()
    y[:, 20:] = (y[:, 20:] + 1) % cfg.vocab_size  # change only the future
    torch.testing.assert_close(model(y)[:, :20], logits[:, :20])
    assert not torch.allclose(model(y)[:, 20:], logits[:, 20:])
    assert model(x[:, :7]).shape == (3, 7, cfg.vocab_size)  # shorter sequences are fine


def test_build_is_deterministic_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = tiny_lm.build(seed=0), tiny_lm.build(seed=0), tiny_lm.build(seed=1)
    assert torch.rand(1).item() == expected_next.item()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.head.weight, c.head.weight)


def test_corpus_batches_are_deterministic_and_follow_the_chain():
    corpus = MarkovCorpus(64, 4, seed=0)
    x, y = corpus.batch(3, 8, 32)
    x2, y2 = MarkovCorpus(64, 4, seed=0).batch(3, 8, 32)
    assert x.shape == y.shape == (8, 32) and x.dtype == torch.long
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
    assert not torch.equal(corpus.batch(4, 8, 32)[0], x)
    assert not torch.equal(MarkovCorpus(64, 4, seed=1).batch(3, 8, 32)[0], x)
    # every observed transition has positive probability; frequencies follow the table
    x, y = corpus.batch(0, 4096, 32)
    counts = torch.zeros(64, 64, dtype=torch.float64)
    counts.index_put_((x.reshape(-1), y.reshape(-1)),
                      torch.ones(x.numel(), dtype=torch.float64), accumulate=True)
    assert counts[corpus.transition == 0].sum() == 0
    freq = counts / counts.sum(dim=1, keepdim=True)
    busy = counts.sum(dim=1) > 2000  # rows seen often enough for a tight estimate
    assert busy.sum() >= 16
    assert (freq[busy] - corpus.transition[busy]).abs().max() < 0.05


def test_corpus_table_stationary_and_entropy():
    corpus = MarkovCorpus(16, 3, seed=2)
    p = corpus.transition
    torch.testing.assert_close(p.sum(dim=1), torch.ones(16, dtype=torch.float64))
    assert ((p > 0).sum(dim=1) == 3).all()
    pi = corpus.stationary()
    torch.testing.assert_close(pi @ p, pi)
    assert 0 < corpus.entropy_rate() < math.log(3) + 1e-12
    assert MarkovCorpus(8, 1, seed=0).entropy_rate() == pytest.approx(0.0, abs=1e-12)


def test_shard_batch_partitions_the_global_batch():
    x = torch.arange(24).view(12, 2)
    for d in (1, 2, 3, 4):
        shards = [tiny_lm.shard_batch(x, r, d) for r in range(d)]
        assert all(s.shape == (12 // d, 2) for s in shards)
        assert torch.equal(torch.cat(shards), x)


def test_lm_loss_and_training_lower_the_loss():
    torch.manual_seed(0)
    cfg = TinyLMConfig()
    corpus = MarkovCorpus(cfg.vocab_size, 4, 0)
    model = tiny_lm.build(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    x, y = corpus.batch(0, 16, cfg.seq_len)
    first = tiny_lm.lm_loss(model, x, y)
    ref = torch.nn.functional.cross_entropy(model(x).reshape(-1, 64), y.reshape(-1))
    torch.testing.assert_close(first, ref)
    assert abs(first.item() - tiny_lm.uniform_loss(cfg)) < 0.5  # near ln(64) at the start
    for step in range(25):
        x, y = corpus.batch(step, 16, cfg.seq_len)
        loss = tiny_lm.lm_loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
    assert corpus.entropy_rate() < loss.item() < first.item() - 1.0


@pytest.mark.parametrize("kwargs, word", [
    ({"d_model": 66}, "d_model"), ({"vocab_size": 1}, "vocab_size"), ({"n_layers": 0}, "n_layers"),
    ({"seq_len": 2.5}, "seq_len"), ({"n_heads": True}, "n_heads"),
])
def test_bad_config(kwargs, word):
    with pytest.raises(ValueError, match=word):
        TinyLMConfig(**kwargs)


def test_bad_inputs():
    model = tiny_lm.build()
    with pytest.raises(ValueError, match="int64"):
        model(torch.zeros(2, 4))
    with pytest.raises(ValueError, match="seq_len"):
        model(torch.zeros(2, 33, dtype=torch.long))
    with pytest.raises(ValueError, match="same shape"):
        tiny_lm.lm_loss(model, torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="cfg"):
        tiny_lm.TinyLM("big")
    with pytest.raises(ValueError, match="cfg"):
        tiny_lm.predicted_param_count(None)
    with pytest.raises(ValueError, match="model"):
        tiny_lm.count_params([torch.zeros(3)])
    with pytest.raises(ValueError, match="seed"):
        tiny_lm.build(seed="0")
    with pytest.raises(ValueError, match="n_successors"):
        MarkovCorpus(8, 9)
    with pytest.raises(ValueError, match="vocab_size"):
        MarkovCorpus(1)
    with pytest.raises(ValueError, match="seed"):
        MarkovCorpus(8, 2, seed=1.5)
    corpus = MarkovCorpus(8, 2)
    for args, word in (((-1, 2, 3), "step"), ((0, 0, 3), "batch_size"), ((0, 2, 0), "seq_len")):
        with pytest.raises(ValueError, match=word):
            corpus.batch(*args)
    x = torch.zeros(6, 3)
    with pytest.raises(ValueError, match="dp_rank"):
        tiny_lm.shard_batch(x, 2, 2)
    with pytest.raises(ValueError, match="dp_size"):
        tiny_lm.shard_batch(x, 0, 0)
    with pytest.raises(ValueError, match="divide evenly"):
        tiny_lm.shard_batch(x, 0, 4)


# --------------------------------------------------------------------------- the toy MLPs


def test_toy_mlp_layers_and_seeded_weights():
    """One builder for every lecture's small MLP: its layers in order, the weights torch's own
    Linear initialisation draws after ``torch.manual_seed(seed)``, the caller's stream untouched."""
    model = toy.toy_mlp([4, 8, 8, 2], seed=3, activation="relu", dropout=0.25)
    assert [type(m).__name__ for m in model] == ["Linear", "ReLU", "Dropout", "Linear", "ReLU",
                                                  "Dropout", "Linear"]
    blocks = toy.toy_mlp([5, 5, 5], seed=0, final_activation=True)
    assert [type(m).__name__ for m in blocks] == ["Linear", "Tanh", "Linear", "Tanh"]
    assert toy.toy_mlp([3, 2], seed=0, dtype=torch.bfloat16)[0].weight.dtype == torch.bfloat16
    torch.manual_seed(3)
    want = [torch.nn.Linear(4, 8), torch.nn.Linear(8, 8), torch.nn.Linear(8, 2)]
    state = torch.get_rng_state()
    got = toy.toy_mlp([4, 8, 8, 2], seed=3, activation="relu", dropout=0.25)
    assert torch.equal(torch.get_rng_state(), state)  # the caller's stream is where it was
    for lin, ref in zip(got[::3], want):
        assert torch.equal(lin.weight, ref.weight) and torch.equal(lin.bias, ref.bias)


def test_seeded_builds_the_same_module_twice():
    with toy.seeded(7):
        a = torch.nn.Linear(3, 3)
    with toy.seeded(7):
        b = torch.nn.Linear(3, 3)
    assert torch.equal(a.weight, b.weight)
    with pytest.raises(ValueError, match="seed must be an int"):
        with toy.seeded(1.5):
            pass


@pytest.mark.parametrize("kwargs, words", [
    ({"sizes": [4]}, r"sizes must be a sequence of at least 2 ints >= 1"),
    ({"sizes": [4, 0]}, r"sizes\[1\] must be an int >= 1"),
    ({"sizes": "48"}, "sizes must be"),
    ({"activation": "sigmoid"}, r"activation must be one of \['gelu', 'relu', 'tanh'\]"),
    ({"final_activation": 1}, "final_activation must be True or False"),
    ({"dropout": 1.0}, r"dropout must be a finite number >= 0 and < 1"),
    ({"seed": "0"}, "seed must be an int"),
])
def test_toy_mlp_bad_arguments_are_named(kwargs, words):
    args = {"sizes": [4, 2], "seed": 0, **kwargs}
    with pytest.raises(ValueError, match=words):
        toy.toy_mlp(args.pop("sizes"), **args)


@pytest.mark.parametrize("call, message", [
    (lambda: validate.check_real("x", float("inf"), None), "x must be a finite number; got inf"),
    (lambda: validate.check_real("x", 1, 0, maximum=1), "x must be a finite number > 0 and < 1"),
    (lambda: validate.check_bool("b", 0), "b must be True or False; got 0"),
    (lambda: validate.check_ints("s", []), "s must be a non-empty sequence of ints >= 1; got []"),
    (lambda: validate.check_ints("s", [1, True]), "s[1] must be an int >= 1; got True"),
    (lambda: validate.check_index("rank", 2, 2), "rank must be an int from 0 to 1; got 2"),
    (lambda: validate.one_of("k", "z", ("b", "a")), "k must be one of ['b', 'a']; got 'z'"),
    (lambda: validate.one_of("k", True, {0: "a", 1: "b"}), "k must be one of [0, 1]; got True"),
])
def test_validate_names_the_argument_and_what_is_allowed(call, message):
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value).startswith(message)


def test_validate_returns_what_it_accepts():
    assert validate.check_ints("s", (1, 2)) == [1, 2]
    assert validate.check_real("x", 2, maximum=3) == 2.0
    assert validate.one_of("k", "b", ("a", "b")) == "b"
    assert validate.one_of("k", "b", {"b": 5}) == 5
    assert validate.check_index("rank", 0, 1) == 0 and validate.check_bool("b", False) is False
