"""Judge of a6_device_mesh: one function per test cell, run by the grader outside the kernel.

Each function gets ``got`` and ``ref``: ``{name: value}`` that the student's and the reference
solution's hidden tests submitted (``course_utils.assess.checks.submit``), and raises AssertionError
with the message that names the mistake. See ``grading/judge.py``.

The groups a real ``init_device_mesh`` builds (Q2) are the reference run's submissions; the
coordinates, groups and group sums of the plain-Python checks are recomputed here.
"""

from course_utils.assess import checks

# Course helpers that compute a graded answer outright, per answer cell: a submission whose
# answer cell (or any cell it added) uses one is flagged in the instructor's report
# (grading.integrity.helper_uses), since the question asks for the reasoning the helper does.
HELPERS_NOT_ALLOWED = {
    "q1": ["mesh.hand_mesh_groups", "mesh.torch_mesh_groups", "mesh.axis_group"],
    "q2": ["mesh.hand_mesh_groups", "mesh.torch_mesh_groups", "mesh.axis_group"],
    "q3": ["mesh.axis_group", "mesh.hand_mesh_groups"],
    "q4": ["mesh.plan_costs.plan", "mesh.plan_view.summary", "memory.zero_state_bytes"],
    "q5": ["mesh.plan_costs.plan", "mesh.plan_view.summary", "memory.zero_state_bytes",
           "memory.fits"],
}


def _flat(items):
    return [v for item in items for v in item]


def _prod(sizes):
    n = 1
    for s in sizes:
        n *= s
    return n


def _ref_coords(rank, sizes):
    """Coordinates of ``rank`` (row-major, last axis fastest)."""
    out = []
    for size in reversed(sizes):
        rank, c = divmod(rank, size)
        out.append(c)
    return tuple(reversed(out))


def _ref_group(rank, sizes, axis):
    """Ranks whose coordinates other than ``axis`` equal rank's."""
    mine = _ref_coords(rank, sizes)
    return [r for r in range(_prod(sizes)) if all(
        c == m for k, (c, m) in enumerate(zip(_ref_coords(r, sizes), mine)) if k != axis)]


def _per_rank(name, value, n):
    """``value`` is a list of one entry per rank (what the hidden test submitted)."""
    assert type(value) is list and len(value) == n, f"{name} should give one entry per rank"
    return value


def _shown(item):
    return tuple(item) if type(item) is list else item


def _same(name, got, want, mistakes=()):
    """check_sequence, with a message naming a known mistake."""
    try:
        checks.check_sequence(name, got, want)
    except AssertionError:
        for wrong, message in mistakes:
            if type(got) in (list, tuple) and list(got) == list(wrong):
                raise AssertionError(f"{name} = {list(got)}: {message}") from None
        raise


def q1_test(got, ref):
    _same("coords_21", got["coords_21"], (2, 1, 1), [
        ((1, 1, 2), "you made the first axis vary fastest; in row-major order the last axis (tp) "
                    "varies fastest: tp = 21 % 4, pp = (21 // 4) % 2, dp = 21 // 8"),
        ((1, 0, 5), "divide by the product of the inner sizes: dp = 21 // (2 * 4)")])
    _same("tp_group_21", got["tp_group_21"], [20, 21, 22, 23], [
        ([5, 13, 21, 29], "that is the DP group: the TP group varies the innermost coordinate, "
                          "so its ranks are consecutive"),
        ([17, 21], "that is the PP group")])
    _same("pp_group_21", got["pp_group_21"], [17, 21], [
        ([20, 21, 22, 23], "that is the TP group; the PP group varies the middle coordinate "
                           "(stride TP = 4)"),
        ([21, 25], "rank 21 is stage 1, so its stage-0 partner is 21 - 4 = 17")])
    _same("dp_group_21", got["dp_group_21"], [5, 13, 21, 29], [
        ([20, 21, 22, 23], "that is the TP group; the DP group varies the outermost coordinate "
                           "(stride TP x PP = 8)"),
        ([1, 5, 9, 13, 17, 21, 25, 29], "the DP group has DP = 4 ranks: same pp and tp, any "
                                        "dp")])
    _same("tp_group_21_tp_outer", got["tp_group_21_tp_outer"], [5, 13, 21, 29], [
        ([20, 21, 22, 23], "with TP outermost, TP ranks are PP x DP = 8 apart, not consecutive")])
    checks.check_number("tp_groups_crossing", got["tp_groups_crossing"], 4, mistakes=[
        (0, "TP is not innermost here: PP is, so TP ranks are 2 apart and each TP group spans 16 "
            "ranks, two nodes"),
        (2, "there are DP x PP = 4 TP groups, and every one spans two nodes")])


def _draw_q2(rng):
    """coords_of / group_of's hidden meshes, drawn per submission: a 3-D one, a 2-D one with
    unequal sides, a 4-D one with a size-1 axis (in a random place) and a 1-D one."""
    a, b = rng.sample([2, 3, 4, 5], 2)
    four = [rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 3)]
    four.insert(rng.randrange(4), 1)
    return [[rng.randint(2, 4), rng.randint(2, 3), rng.randint(2, 4)], [a, b], four,
            [rng.randint(3, 9)]]


def _draw_q3(rng):
    """axis_sum's hidden meshes, drawn per submission: a 2-D one, a 3-D one with a size-1 axis
    and a 1-D one, each of at most 6 ranks (the same number of axes for everyone: the
    submissions keep their names)."""
    return [rng.choice([[2, 3], [3, 2], [2, 2], [1, 4], [4, 1], [1, 3]]),
            rng.choice([[1, 3, 2], [2, 1, 3], [3, 2, 1], [2, 1, 2], [1, 2, 2]]),
            rng.choice([[3], [4], [5], [6]])]


HIDDEN_CASES = {"q2_test": _draw_q2, "q3_test": _draw_q3}


def q2_test(got, ref):
    for k, sizes in enumerate(got.cases, 1):
        sizes, where = tuple(sizes), f"hidden mesh {k}"
        n = _prod(sizes)
        name = f"coords_of for every rank of {where}"
        mine = _per_rank(name, got[name], n)
        want = [list(_ref_coords(r, sizes)) for r in range(n)]
        first_fastest = [list(reversed(_ref_coords(r, tuple(reversed(sizes))))) for r in range(n)]
        if mine != want and mine == first_fastest:
            raise AssertionError(f"coords_of on {where}: the first axis varies fastest in "
                                 "your layout; in row-major order the last axis varies fastest")
        for r in range(n):
            assert mine[r] == want[r], f"coords_of on {where}, rank {r}: not right"
        checks.check_sequence(name, _flat(mine), _flat(want))
        for axis in range(len(sizes)):
            name = f"group_of for every rank of {where}, axis {axis}"
            mine = _per_rank(name, got[name], n)
            want = [_ref_group(r, sizes, axis) for r in range(n)]
            for r in range(n):
                assert mine[r] == want[r], f"group_of on {where}, rank {r}, axis {axis}: not right"
            checks.check_sequence(name, _flat(mine), _flat(want))

    for sizes, world in [((2, 2), 4), ((2, 1, 2), 4), ((1, 4), 4), ((2, 2, 2), 8)]:
        for k in range(len(sizes)):
            views = ref[f"init_device_mesh{sizes} groups, axis {k}"]  # the real DeviceMesh's
            name = f"group_of on the init_device_mesh{sizes} ranks, axis {k}"
            mine = _per_rank(name, got[name], world)
            try:
                mine_sorted = [sorted(g) for g in mine]
            except TypeError:
                raise AssertionError(f"group_of on a {sizes} mesh should return lists of ints "
                                     "(rank numbers)") from None
            for rank in range(world):
                assert mine_sorted[rank] == views[rank], (
                    f"on a real {sizes} DeviceMesh, rank {rank}'s group along axis {k} is "
                    f"{views[rank]}; group_of gives {mine[rank]}")
            checks.check_sequence(f"group_of vs init_device_mesh{sizes}, axis {k}",
                                  _flat(mine_sorted), _flat(views))
        name = f"coords_of on the init_device_mesh{sizes} ranks"
        checks.check_sequence(f"coords_of vs init_device_mesh{sizes}",
                              _flat(_per_rank(name, got[name], world)),
                              _flat(ref[f"init_device_mesh{sizes} coords"]))


def q3_test(got, ref):
    for k, sizes in enumerate(got.cases, 1):
        sizes, world = tuple(sizes), _prod(sizes)
        for axis in range(len(sizes)):
            name = f"axis_sum on every rank (hidden mesh {k}, axis {axis})"
            values = _per_rank(name, got[name], world)
            for rank, value in enumerate(values):
                want = sum(10.0 ** r for r in _ref_group(rank, sizes, axis))  # one process
                checks.check_number(f"axis_sum on rank {rank} (hidden mesh {k}, axis {axis})",
                                    value, want, rel=1e-9, mistakes=[
                    (10.0 ** rank, "that is only this rank's own value: all-reduce over the "
                                   "group"),
                    (sum(10.0 ** r for r in range(world)),
                     "that is the sum over all ranks: pass your group to all_reduce")])


def q4_test(got, ref):
    tp, pp, dp, n = got.givens.q4
    devices, shard = tp * pp * dp, n / (tp * pp)
    checks.check_number("params_per_shard_b", got["params_per_shard_b"], shard, mistakes=[
        (n / devices, f"you counted the DP ranks in the model shard: each DP index holds a "
                      f"whole copy of the model, split over its TP x PP = {tp * pp} devices"),
        (n / tp, "PP splits the layers too: divide by TP x PP"),
        (n * 1e9 / (tp * pp), "give the answer in billions of parameters")])
    zero3 = shard * 16 / dp
    checks.check_number("gb_zero3", got["gb_zero3"], zero3, mistakes=[
        (shard * 16 / devices, f"you applied ZeRO-3 over all {devices} devices; ZeRO shards "
                               f"over the DP = {dp} ranks, the TP/PP split already divided the "
                               f"model by {tp * pp}"),
        (n / devices * 16 / dp, "you counted the DP ranks in the model shard and then divided "
                                "by DP again"),
        (shard * 16, f"ZeRO-3 shards the whole 16 bytes over the DP = {dp} ranks: divide by "
                     f"{dp}"),
        (zero3 * 1e9 / 2**30, "that is GiB; the question asks for GB (10**9 bytes)")])
    checks.check_number("gb_zero1", got["gb_zero1"], shard * (4 + 12 / dp), mistakes=[
        (zero3, f"that is ZeRO-3; ZeRO-1 shards only the 12 optimizer bytes (master copy and "
                f"moments), weights and gradients stay whole: (4 + 12/{dp}) x {shard:g}"),
        (shard * (2 + 14 / dp), "that is ZeRO-2 (gradients sharded too); ZeRO-1 shards only the "
                                "optimizer bytes"),
        (shard * (4 + 12 / devices), f"ZeRO-1 shards over the DP = {dp} ranks, not all "
                                     f"{devices} devices")])


def q5_test(got, ref):
    for plan, (n, tp, pp, dp) in zip("ab", got.givens.q5):
        shard, devices = n / (tp * pp), tp * pp * dp
        gb = shard * (4 + 12 / dp)
        mistakes = [(shard * 16 / dp, "that is ZeRO-3; ZeRO-1 keeps weights and gradients whole "
                                      "and shards only the 12 optimizer bytes"),
                    (n / devices * (4 + 12 / dp), "you counted the DP ranks in the model shard"),
                    (shard * (2 + 14 / dp), "that is ZeRO-2; ZeRO-1 keeps the gradients whole")]
        if devices != dp:
            mistakes.append((shard * (4 + 12 / devices), f"ZeRO-1 shards over the DP = {dp} "
                                                         f"ranks, not all {devices} devices"))
        checks.check_number(f"gb_{plan}", got[f"gb_{plan}"], gb, mistakes=mistakes)
        hint = "" if gb <= 80 else (f"{gb:g} GB of persistent state does not fit 80 GB: "
                                    "ZeRO-2/3 or more TP/PP would be needed")
        checks.check_choice(f"fits_{plan}", got[f"fits_{plan}"], gb <= 80, [True, False],
                            hint=hint)
