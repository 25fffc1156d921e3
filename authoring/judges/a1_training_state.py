"""Judge of a1_training_state: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.
"""

from course_utils.assess.checks import check_choice, check_number

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1_state_gb": ["memory.state_bytes", "memory.layout", "memory.replica_state_bytes",
                    "memory.to_gb"],
    "q2_state_gib": ["memory.state_bytes", "memory.replica_state_bytes", "memory.to_gib"],
    "q3": ["memory.state_bytes", "memory.layout", "memory.replica_state_bytes", "memory.to_gb"],
    "q4": ["memory.fits", "memory.state_bytes", "memory.layout"],
    "max_params": ["memory.fits", "memory.state_bytes", "memory.layout"],
}


def q1_state_gb_test(got, ref):
    n = got.givens.n_params
    check_number("q1_state_gb", got["q1_state_gb"], n * 16 / 1e9, unit="GB", mistakes=[
        (n * 16, "that is the count in bytes; divide by 10**9 to get GB."),
        (n * 16 / 2**30, "that is GiB (2**30 bytes); the question asks for GB (10**9 bytes)."),
        (n * 12 / 1e9, "that is 12 bytes/parameter: either the 4-byte FP32 master copy is "
                       "missing (2 + 2 + 8) or only the optimizer bucket (4 + 8) was counted. "
                       "The layout totals 16."),
        (n * 8 / 1e9, "that counts only Adam's two FP32 moments (8 bytes); add weights, "
                      "gradients and the master copy."),
        (n * 14 / 1e9, "that is 14 bytes/parameter: one of the 2-byte items (weights or "
                       "gradients) is missing."),
    ])


def q2_state_gib_test(got, ref):
    n = got.givens.n_params
    check_number("q2_state_gib", got["q2_state_gib"], n * 16 / 2**30, unit="GiB", mistakes=[
        (n * 16 / 1e9, "that is still GB: divide the byte count by 2**30, not 10**9."),
        (n * 16 / 1e9 * 2**30 / 1e9, "the conversion went the wrong way: a GiB is larger than "
                                     "a GB, so the number of GiB is smaller."),
        (n * 16 / 2**20, "that divides by 2**20 (MiB); a GiB is 2**30 bytes."),
    ])


def q3_test(got, ref):
    n = got.givens.n_params
    check_number("q3_bytes_per_param", got["q3_bytes_per_param"], 14, mistakes=[
        (18, "18 keeps the FP32 master copy (4 bytes); this stack updates the BF16 weights "
             "directly, so that column is 0."),
        (12, "12 keeps the gradients in BF16 (2 bytes); this stack accumulates them in FP32 "
             "(4 bytes)."),
        (16, "16 is the lesson's layout unchanged: the gradients grow to 4 bytes and the master "
             "copy goes."),
        (10, "the gradients are FP32 here: 4 bytes, not 2, and the master copy is gone."),
        (20, "only the gradients change to FP32 (2 -> 4 bytes); the weights stay BF16."),
    ])
    check_number("q3_state_gb", got["q3_state_gb"], n * 14 / 1e9, unit="GB", mistakes=[
        (n * 14, "that is bytes; divide by 10**9 for GB."),
        (n * 14 / 2**30, "that is GiB; the question asks for GB."),
        (n * 18 / 1e9, "that keeps the FP32 master copy (18 bytes/parameter); this stack has "
                       "none."),
        (n * 12 / 1e9, "that keeps BF16 gradients (12 bytes/parameter); this stack's are FP32."),
        (n * 16 / 1e9, "that is the 16-byte layout; this stack uses 14 bytes/parameter."),
    ])


def q4_test(got, ref):
    n, device_gb = got.givens.q4
    for name, per, what in (("q4a_fits", 16, "in the 16-byte layout"),
                            ("q4b_fits", 12, "without the master copy (12 B/param)")):
        need = n * per / 1e9
        fits = need <= device_gb
        check_choice(name, got[name], fits, [True, False], mistakes={not fits: (
            f"{what} the state is {n / 1e9:g}e9 x {per} B = {need:g} GB, "
            + ("within" if fits else "more than") + f" the {device_gb:g} GB device.")})


def _draw_max_params(rng):
    """max_params' hidden cases, drawn per submission: a device size in GB with 16 bytes per
    parameter (the count divides evenly), then one whose count does not (rounding shows)."""
    while True:
        gb, per = rng.randrange(8, 193), rng.choice([3, 6, 7, 12, 14, 18])
        if gb * 10**9 % per:
            return [[rng.randrange(16, 193), 16], [gb, per]]


HIDDEN_CASES = {"max_params_test": _draw_max_params}


def max_params_test(got, ref):
    (gb, per), (gb2, per2) = got.cases
    check_number("max_params on hidden case 1", got["hidden case 1"], gb * 10**9 // per,
                 rel=1e-9, mistakes=[
        (gb * 2**30 // per, "that uses GiB (2**30) for the device; the device size is in GB "
                            "(10**9)."),
        (gb / per, "that is in billions and lost the units: return the number of parameters."),
    ])
    right = gb2 * 10**9 // per2
    check_number("max_params on hidden case 2", got["hidden case 2"], right, rel=0,
                 abs_tol=0.5, mistakes=[(right + 1, "you rounded up: that many parameters need "
                                                    "more than the device holds. Round down.")],
                 hint="Round down to a whole parameter.")
    assert type(got["hidden case 2"]) is int, (
        "max_params should return an int (use int(...) or //).")
    for bad in [(0, 16), (64, 0), (-1, 16)]:
        outcome = got[f"max_params{bad} raises"]
        assert outcome == "ValueError", (
            f"max_params{bad} should raise ValueError for a non-positive argument"
            + (" (it returned a value)." if outcome == "returned" else f" (it raised {outcome}).")
        )
