"""Per-student variants (issue 26), the student's side: where the identity comes from (make lab
records it once), seeds, givens drawn per student. The grading side (every variant judged,
the reference under 20 students' numbers): tests/test_variant_grading.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from course_utils.assess import variants

TOY = "toy_assignment"


@pytest.fixture
def toy(monkeypatch, tmp_path):
    """A registered toy assignment, no identity in the environment, no identity file."""
    from course_utils.assess import givens as assignment_givens

    monkeypatch.setitem(assignment_givens.GIVENS, TOY, {
        "n_params_b": variants.given("parameters, billions", 13, 3, 7, 34, 70),
        "dp": variants.given("ranks", 8, 2, 4, 16)})
    for var in (variants.IDENTITY_ENV, variants.HUB_ENV):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(variants.IDENTITY_FILE_ENV, str(tmp_path / "identity"))
    return tmp_path / "identity"


def test_identity_precedence(toy, monkeypatch):
    """The grader's COURSE_STUDENT, then the hub's user, then make lab's file, then none."""
    assert variants.identity() is None
    toy.write_text("carol\n")
    assert variants.identity() == "carol"
    monkeypatch.setenv(variants.HUB_ENV, "bob")
    assert variants.identity() == "bob"
    monkeypatch.setenv(variants.IDENTITY_ENV, "alice")
    assert variants.identity() == "alice"
    monkeypatch.setenv(variants.IDENTITY_ENV, "")          # the grader, variants off: base
    assert variants.identity() is None


@pytest.mark.parametrize("bad", [" ", "a b", "../etc", "x" * 101, "-leading"])
def test_malformed_identities_name_where_they_came_from(toy, monkeypatch, bad):
    monkeypatch.setenv(variants.HUB_ENV, bad)
    with pytest.raises(ValueError, match="JUPYTERHUB_USER"):
        variants.identity()
    monkeypatch.delenv(variants.HUB_ENV)
    toy.write_text(bad)
    if bad.strip():
        with pytest.raises(ValueError, match="identity"):
            variants.identity()


def test_seeds_are_stable_and_differ():
    s = variants.seed("a3_zero", "alice")
    assert s == variants.seed("a3_zero", "alice") and 0 <= s < 2**64
    assert s != variants.seed("a3_zero", "bob") and s != variants.seed("a4_tensor_parallel", "alice")
    # pinned: a change of the seeding would silently give every student new numbers mid-course
    assert variants.seed("a3_zero", "alice") == int.from_bytes(
        __import__("hashlib").sha256(b"a3_zero\0alice").digest()[:8], "big")


def test_givens_per_student(toy, monkeypatch):
    base = variants.givens(TOY)
    assert base.student is None and base.variant == "base"
    assert dict(base) == variants.base(TOY) == {"n_params_b": 13, "dp": 8}
    alice = variants.givens(TOY, student="alice")
    assert alice.student == "alice" and alice == variants.givens(TOY, student="alice")
    assert alice.n_params_b in (3, 7, 13, 34, 70) and alice["dp"] in (2, 4, 8, 16)
    monkeypatch.setenv(variants.IDENTITY_ENV, "alice")
    assert dict(variants.givens(TOY)) == dict(alice)                     # from the identity
    assert dict(variants.givens(TOY, on=False)) == variants.base(TOY)   # the switch
    drawn = {variants.givens(TOY, student=f"s{i:02d}").variant for i in range(20)}
    assert len(drawn) >= 8          # 20 students over 5 x 4 combinations: most of them differ
    assert "alice" in repr(alice) and "n_params_b = " in repr(alice)


def test_bad_input(toy):
    with pytest.raises(ValueError, match="on"):
        variants.givens(TOY, on="yes")
    with pytest.raises(ValueError, match="has no givens"):
        variants.givens("nope")
    with pytest.raises(ValueError, match="student"):
        variants.givens(TOY, student="a b")
    with pytest.raises(ValueError, match="assignment"):
        variants.seed("", "alice")
    with pytest.raises(ValueError, match="has no givens"):
        variants.draw("nope", "alice")
    with pytest.raises(ValueError, match="at least one"):
        variants.given("N")
    with pytest.raises(ValueError, match="twice"):
        variants.given("N", 1, 1)
    with pytest.raises(ValueError, match="label"):
        variants.given("", 1)
    with pytest.raises(ValueError, match="no given 'budget'"):
        variants.every_variant(TOY, ["dp", "budget"])
    with pytest.raises(ValueError, match="names of givens"):
        variants.givens(TOY).key("budget")
    with pytest.raises(ValueError, match="no given 'budget'"):
        variants.givens(TOY).replaced(budget=3)
    with pytest.raises(AttributeError, match="its givens"):
        variants.givens(TOY).budget_gb


def test_the_switch_is_read_from_the_released_cell():
    assert variants.switch_of('G = variants.givens("a3_zero")\nprint(G)') is True
    assert variants.switch_of('G = variants.givens("a3_zero", on=False)') is False
    assert variants.switch_of("x = 1") is None and variants.switch_of("def (") is None
    with pytest.raises(ValueError, match="literal"):
        variants.switch_of('G = variants.givens("a3_zero", on=ON)')


def test_make_lab_records_the_identity_once(monkeypatch, tmp_path):
    """make lab (scripts/lab.py) asks once in a terminal, refuses a malformed id and asks
    again, keeps the answer in the identity file the kernels read, and says where; without a
    terminal it records nothing and says how; a hub's user wins over the file."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import lab

    for var in (variants.IDENTITY_ENV, variants.HUB_ENV):
        monkeypatch.delenv(var, raising=False)
    path = tmp_path / "identity"
    monkeypatch.setenv(variants.IDENTITY_FILE_ENV, str(path))
    assert "--identity" in lab.record_identity(interactive=False) and not path.exists()
    answers = iter(["a b", "alice"])
    line = lab.record_identity(ask=lambda prompt: next(answers), interactive=True)
    assert "drawn for alice" in line and str(path) in line
    assert variants.identity() == "alice" and path.read_text() == "alice\n"
    asked = []
    assert "alice" in lab.record_identity(ask=asked.append, interactive=True) and not asked
    assert "drawn for bob" in lab.record_identity("bob") and variants.identity() == "bob"
    with pytest.raises(ValueError, match="--identity"):
        lab.record_identity("../x")
    monkeypatch.setenv(variants.HUB_ENV, "carol")
    assert "carol ($JUPYTERHUB_USER)" in lab.record_identity(interactive=True)


def test_every_device_a_question_draws_is_one_a_vendor_sells():
    """Givens that name a device draw its size from ACCELERATOR_GB (a 52 GB device is no real
    accelerator: issue 36); the givens whose label names a device GB are all listed."""
    from course_utils.assess.givens import ACCELERATOR_GB, DEVICE_GIVENS, GIVENS

    named = {(a, n) for a, table in GIVENS.items() for n, g in table.items()
             if "device GB" in g.label}
    assert named == set(DEVICE_GIVENS)
    for (assignment, name), index in DEVICE_GIVENS.items():
        g = GIVENS[assignment][name]
        parts = g.label.split("(", 1)[1].rstrip(")").split(", ")
        assert parts[index] == "device GB", (g.label, index)
        unsold = [option for option in g.options if option[index] not in ACCELERATOR_GB]
        assert not unsold, f"{assignment} {name}: no accelerator has {unsold}"


def test_a1_q4_options_cover_every_outcome_apart_from_the_device_size():
    """a1 Q4 asks whether 16 and 12 bytes per parameter fit: its options give each of the three
    outcomes (both, only 12, neither), every state at least 5 % from the device size."""
    from course_utils.assess.givens import GIVENS

    outcomes = set()
    for n, device_gb in GIVENS["a1_training_state"]["q4"].options:
        for per_param in (16, 12):
            assert abs(n * per_param / 1e9 - device_gb) >= 0.05 * device_gb, (n, device_gb)
        outcomes.add((n * 16 <= device_gb * 1e9, n * 12 <= device_gb * 1e9))
    assert outcomes == {(True, True), (False, True), (False, False)}
