"""Judge of a8_jax_sharding: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

The facts a prediction is judged against (the collectives in the compiled HLO, the bytes in
``addressable_shards``) are the ones the reference run read from the compiled programs; each
is also checked against the lecture's expectation, so a JAX upgrade that changes them fails
the reference loudly instead of grading against a silently changed answer.
"""

import numpy as np
import torch

from course_utils.assess import checks

CHOICES = ["none", "all-gather", "all-reduce", "reduce-scatter"]

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q2": ["jax_sharding.compile_plan", "jax_sharding.local_bytes", "jax_sharding.compiled_text",
           "jax_sharding.collective_names", "jax_sharding.bytes_per_device",
           "jax_sharding.shard_table"],
    "q3": ["jax_sharding.shard_map_linear"],
}

SPECS = {"spec_x": ["data", None], "spec_w1": ["data", "model"], "spec_w2": ["model", "data"],
         "spec_y": ["data", None]}
MIXED_AXES = ("mixing up the axis names: the batch is split over \"data\" and the weights over "
              "\"model\" by tensor parallelism (and stored split over \"data\" by FSDP)")
NO_FSDP = ("the weights are also stored split over \"data\" (FSDP), along the dim tensor "
           "parallelism leaves whole: this spec replicates it over \"data\"")
SPEC_MISTAKES = {
    ("spec_w1", ("model", "data")): "W1 is column-parallel: \"model\" splits its columns (dim "
    "1, the ffn features), and FSDP's \"data\" the other dim. Splitting its rows over "
    "\"model\" shards the contraction dim, and each device would hold only a partial sum",
    ("spec_w1", (None, "model")): NO_FSDP,
    ("spec_w1", ("model", None)): "W1 is column-parallel: split its columns (dim 1) over "
    "\"model\"; and store its rows split over \"data\"",
    ("spec_w1", ("data", None)): MIXED_AXES,
    ("spec_w1", (None, "data")): MIXED_AXES,
    ("spec_w2", ("data", "model")): "W2 is row-parallel: \"model\" splits its rows (dim 0), the "
    "ffn features each device's columns of W1 produced, and FSDP's \"data\" its columns",
    ("spec_w2", ("model", None)): NO_FSDP,
    ("spec_w2", (None, "model")): "W2 is row-parallel: split its rows (dim 0) over \"model\"; "
    "splitting its columns needs the hidden features gathered first",
    ("spec_w2", ("data", None)): MIXED_AXES,
    ("spec_w2", (None, "data")): MIXED_AXES,
    ("spec_x", ("model", None)): MIXED_AXES,
    ("spec_x", (None, "data")): MIXED_AXES,
    ("spec_x", ("data", "model")): "X enters a column-parallel layer: every device of a "
    "\"model\" group needs all of its features (dim 1 is not split)",
    ("spec_y", (None, None)): "Y stays split by batch over \"data\": P() would replicate all of "
    "Y on every device and add an all-gather",
    ("spec_y", ("data", "model")): "Y must be whole in its features: the row-parallel partial "
    "sums are added (all-reduce) into the full output",
    ("spec_y", ("model", None)): MIXED_AXES,
}


def _spec_text(entries) -> str:
    return "P(" + ", ".join(repr(e) for e in entries) + ")" if isinstance(entries, list) else (
        repr(entries))


def q1_test(got, ref):
    assert sorted(set(ref["compiled collectives of your specs"])) == ["all-gather", "all-reduce"], (
        "the reference plan no longer compiles to all-gathers (FSDP) and an all-reduce (TP): "
        "JAX changed what it inserts")
    for name, want in SPECS.items():
        value = got[name]
        if value != want:
            key = (name, tuple(value)) if isinstance(value, list) else None
            why = SPEC_MISTAKES.get(key, "that is not the plan the question describes")
            raise AssertionError(f"{name} = {_spec_text(value)}: {why}")
    compiled = got["compiled collectives of your specs"]
    assert compiled == ref["compiled collectives of your specs"], (
        f"your specs compile to {compiled}; the plan compiles to the all-gathers of the weights "
        "over \"data\" and the all-reduce of the row-parallel partial sums over \"model\"")
    assert got["bytes per device of your specs"] == ref["bytes per device of your specs"], (
        "your specs give other bytes per device than the plan's")


def _choice(names) -> str:
    return names[0] if names else "none"


GLOBAL = "counting the bytes of the global array instead of the local shard: a device holds "


def q2_bytes(b, n_in, n_out, rows, cols):
    """Bytes one device holds: W in layout b (split 8 ways), Y in layout c (its columns split 8
    ways), the 2-D weight (split 2 x 4): float32. tests/test_jax_sharding.py compiles every
    variant and checks these against the devices' ``addressable_shards``."""
    return {"w_bytes_b": n_out * n_in * 4 // 8, "y_bytes_c": b * n_out * 4 // 8,
            "w_bytes_2d": rows * cols * 4 // 8}


def q2_test(got, ref):
    # Y = X @ W.T with W (out, in): W's dim 1 is the contraction dim. The collectives do not
    # depend on the sizes; the bytes are the student's own sizes'.
    expected = {"a": "all-gather", "b": "all-reduce", "c": "none"}
    for k, want in expected.items():  # (what the reference's kernel compiled, where it ran)
        if ref is not None and f"compiled {k}: collectives" in ref:
            assert _choice(ref[f"compiled {k}: collectives"]) == want, (
                f"layout {k} no longer compiles to {want!r}: JAX changed what it inserts")
    transposed = ("W is (out_features, in_features) and the layer uses W.T: W: P(\"model\", None) "
                  "splits the OUTPUT features, a column-parallel layer")
    checks.check_choice("collective_a", got["collective_a"], expected["a"], CHOICES, mistakes={
        "all-reduce": transposed + "; its pieces are different features, concatenated "
                      "(all-gather), not added",
        "none": "each device holds only its own output features of Y, and Y: P() asks for all "
                "of it on every device"})
    checks.check_choice("collective_b", got["collective_b"], expected["b"], CHOICES, mistakes={
        "none": "W: P(None, \"model\") splits W's dim 1, the in_features that W.T contracts: "
                "each device holds a partial sum of the full Y, and the compiler all-reduces "
                "them",
        "all-gather": "W's dim 1 is the contraction dim of X @ W.T: the devices hold partial "
                      "sums, which are added (all-reduce), not concatenated",
        "reduce-scatter": "Y: P() asks for all of Y on every device; a reduce-scatter would "
                          "leave each device only a slice"})
    checks.check_choice("collective_c", got["collective_c"], expected["c"], CHOICES, mistakes={
        "all-reduce": transposed + ", whose outputs are different features, not partial sums",
        "all-gather": "Y: P(None, \"model\") lets Y stay split by features: each device "
                      "computes its own output features from all of X and nothing is gathered"})
    (b, n_in, n_out), (rows, cols) = got.givens.q2, got.givens.q2_2d
    right = q2_bytes(b, n_in, n_out, rows, cols)
    w_global, y_global, w2d_global = n_out * n_in * 4, b * n_out * 4, rows * cols * 4
    checks.check_number("w_bytes_b", got["w_bytes_b"], right["w_bytes_b"], unit="bytes",
                        mistakes=[
        (w_global, GLOBAL + "1/8 of W"),
        (w_global / 4 / 8, "that counts elements; float32 has 4 bytes each")])
    checks.check_number("y_bytes_c", got["y_bytes_c"], right["y_bytes_c"], unit="bytes",
                        mistakes=[
        (y_global, GLOBAL + "only its own columns of Y (Y: P(None, \"model\"))"),
        (y_global / 4 / 8, "that counts elements; float32 has 4 bytes each")])
    checks.check_number("w_bytes_2d", got["w_bytes_2d"], right["w_bytes_2d"], unit="bytes",
                        mistakes=[
        (w2d_global, GLOBAL + "1/8 of the weight"),
        (w2d_global / 4, "P(\"data\", \"model\") splits dim 0 over \"data\" (2) AND dim 1 over "
                         "\"model\" (4): 8 blocks, not 4"),
        (w2d_global / 2, "P(\"data\", \"model\") splits dim 0 over \"data\" (2) AND dim 1 over "
                         "\"model\" (4): 8 blocks, not 2"),
        (w2d_global / 4 / 8, "that counts elements; float32 has 4 bytes each")])


def _q3_inputs():
    """(seed, x, w, b) of each hidden case, from the hidden test's seeds."""
    out = []
    for seed, (tok, h_in, h_out) in ((11, (6, 32, 5)), (12, (3, 8, 7))):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((tok, h_in)).astype(np.float32)
        w = rng.standard_normal((h_in, h_out)).astype(np.float32)
        b = rng.standard_normal(h_out).astype(np.float32)
        out.append((seed, x, w, b))
    return out


def q3_test(got, ref):
    for seed, x, w, b in _q3_inputs():
        y, names = got[f"seed {seed}: y"], got[f"seed {seed}: collectives"]
        expected = x.astype(np.float64) @ w.astype(np.float64) + b      # one device
        assert isinstance(y, torch.Tensor), f"seed {seed}: row_parallel returned no array"
        y = y.numpy()
        assert y.shape == expected.shape, (
            f"seed {seed}: Y has shape {y.shape}; expected (tokens, h_out) = {expected.shape}")
        t = x.shape[1] // 8
        if np.allclose(y, x[:, :t] @ w[:t] + b, atol=1e-4):
            raise AssertionError("Y is device 0's own partial sum: the 8 partial sums must be "
                                 "added with jax.lax.psum over \"model\"")
        if np.allclose(y, expected + 7 * b, atol=1e-4):
            raise AssertionError("the bias was added on every device before the psum, so Y "
                                 "holds it 8 times: add it once, after the sum")
        assert "all-gather" not in names, (
            "you gathered: row-parallel devices hold partial sums of the full output, which are "
            "added, not concatenated")
        assert np.allclose(y, expected, rtol=1e-4, atol=1e-4), (
            f"seed {seed}: row_parallel does not match X @ W + b computed on one device")
        assert names == ref[f"seed {seed}: collectives"] == ["all-reduce"], (
            f"seed {seed}: the compiled program holds {names}; a row-parallel layer needs "
            "exactly one all-reduce")
