"""The class hub's parts at the value level, in seconds (tests/test_hub.py runs the real hub):
account names, the exchange's modes, collect's owner check, feedback's names for nbgrader."""

from __future__ import annotations

import os
import pwd
import shutil
import stat
from pathlib import Path

import pytest

from conftest import ROOT
from hub import accounts, exchange

A = "a1_training_state"
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="owners and modes: root only")


@pytest.mark.parametrize("name", ["Alice", "a@b", "9lives", "", "x" * 33, "a b", "../x", None])
def test_an_id_that_cannot_be_a_unix_account_is_named_with_the_rule(name):
    with pytest.raises(ValueError, match=r"roster id .* 1 to 32 lower-case letters"):
        accounts.check_unix_name(name)


@pytest.mark.parametrize("name", ["ann", "_x", "s-01", "a" * 32])
def test_an_id_that_can_be_an_account_passes(name):
    assert accounts.check_unix_name(name) == name


@root_only
@pytest.mark.parametrize("name", ["root", "daemon", "nobody"])
def test_an_account_the_course_did_not_make_is_never_a_student(name, tmp_path):
    assert not accounts.is_course_account(name)
    with pytest.raises(ValueError, match="the course did not make"):
        accounts.ensure_account(name, tmp_path)


def test_first_passwords_are_random_and_long():
    seen = {accounts.first_password() for _ in range(200)}
    assert len(seen) == 200 and all(len(p) == 12 and p.isalnum() for p in seen)


def test_seeded_passwords_are_kept_and_only_missing_ones_given(tmp_path):
    from firstuseauthenticator import FirstUseAuthenticator

    db = tmp_path / "passwords.dbm"
    first = accounts.seed_passwords(["ann", "bo"], db)
    assert sorted(first) == ["ann", "bo"]
    again = accounts.seed_passwords(["ann", "bo", "cy"], db)
    assert list(again) == ["cy"]  # (ann and bo keep theirs: a restart changes nothing)
    import bcrypt
    import dbm

    with dbm.open(str(db)) as store:
        assert bcrypt.checkpw(first["ann"].encode(), store[b"ann"])
        assert not bcrypt.checkpw(first["bo"].encode(), store[b"ann"])
    assert FirstUseAuthenticator(dbm_path=str(db)).create_users  # (the hub's config turns it off)


@root_only
def test_the_exchange_modes_close_what_nbgrader_leaves_open(tmp_path):
    ex = tmp_path / "exchange"
    exchange.prepare(ex)
    modes = {p: stat.S_IMODE(os.stat(ex / p).st_mode) for p in
             ("", "dtp", "dtp/outbound", "dtp/inbound", "dtp/feedback")}
    assert modes == {"": 0o1777, "dtp": 0o755, "dtp/outbound": 0o755, "dtp/inbound": 0o3733,
                     "dtp/feedback": 0o711}


def _submission(inbound: Path, name: str, owner: str, secret: bytes = b"s3cret") -> Path:
    folder = inbound / name
    folder.mkdir()
    shutil.copy(ROOT / "assignments" / A / f"{A}.ipynb", folder / f"{A}.ipynb")
    (folder / "timestamp.txt").write_text(name.split("+")[2])
    (folder / "submission_secret.txt").write_bytes(secret)
    uid = pwd.getpwnam(owner).pw_uid
    for p in [folder, *folder.iterdir()]:
        os.lchown(p, uid, -1)
    return folder


@root_only
def test_collect_takes_a_submission_only_from_the_student_who_wrote_it(tmp_path):
    from nbgrader.utils import notebook_hash

    ex, private, data = tmp_path / "exchange", tmp_path / "private", tmp_path / "data"
    exchange.prepare(ex)
    inbound = ex / "dtp" / "inbound"
    students = ["daemon", "nobody"]  # (two accounts every Linux has, as two students)
    _submission(inbound, f"daemon+{A}+2026-12-01 10:00:00.000000 UTC+old", "daemon", b"old")
    _submission(inbound, f"daemon+{A}+2026-12-02 10:00:00.000000 UTC+new", "daemon", b"new")
    _submission(inbound, f"nobody+{A}+2026-12-03 10:00:00.000000 UTC+x", "daemon")  # as nobody
    (inbound / f"nobody+{A}+2026-12-04 10:00:00.000000 UTC+y").symlink_to("/etc")
    (inbound / "not-a-submission").mkdir()
    got = exchange.collect(A, ex, private, data, students)

    assert got.collected[A] == ["daemon"]
    assert got.collected.missing[A] == {"nobody": "no submission"}
    refused = got.refused
    assert any("handed in as 'nobody' by 'daemon'" in why for why in refused.values()), refused
    assert any("a link, not a submitted folder" in why for why in refused.values()), refused
    assert "not a submission's name" in refused["'not-a-submission'"]
    # the latest of daemon's two, now root's and closed; the refused ones stay where they were
    assert (data / "submitted" / "daemon" / A / "submission_secret.txt").read_bytes() == b"new"
    kept = private / "inbound" / A
    assert all(os.lstat(p).st_uid == 0 and stat.S_IMODE(os.lstat(p).st_mode) == 0o700
               for p in kept.iterdir())
    assert sorted(p.name.split("+")[0] for p in inbound.iterdir() if "+" in p.name) == \
        ["nobody", "nobody"]

    # feedback goes where nbgrader's fetch_feedback looks for daemon's page, and nowhere else
    page = data / "feedback" / "daemon" / A / f"{A}.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html>daemon's page</html>")
    assert exchange.release_feedback(A, ex, private, data) == ["daemon"]
    name = notebook_hash(secret="new", notebook_id=A) + ".html"
    out = ex / "dtp" / "feedback"
    assert [p.name for p in out.iterdir()] == [name]
    assert stat.S_IMODE(os.stat(out / name).st_mode) == 0o644


@root_only
@pytest.mark.parametrize("roster, said", [
    ("id,first_name,last_name,email\nAnn.Lee,Ann,Lee,a@x\n", "roster id 'Ann.Lee' cannot be a "
                                                            "Unix user name on the hub"),
    ("id,first_name,last_name,email\n", "hub: no students: put the roster in"),
    ("id,first_name,last_name,email\ninstructor,I,N,i@x\n", "instructor is both staff and a "
                                                            "student"),
])
def test_a_hub_that_cannot_start_says_why_and_starts_nothing(tmp_path, roster, said):
    import subprocess
    import sys

    data = tmp_path / "data"
    data.mkdir()
    (data / "roster.csv").write_text(roster)
    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "hub.py"), "--state",
                          str(tmp_path / "state"), "up", "--homes", str(tmp_path / "homes")],
                         env=dict(os.environ, COURSE_DATA=str(data)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode != 0 and said in out.stderr, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr  # (one line, no traceback)
    assert not (tmp_path / "homes").exists()


def test_a_step_without_a_hub_says_how_to_start_one(tmp_path):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, str(ROOT / "scripts" / "hub.py"), "--state",
                          str(tmp_path / "none"), "collect", A], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "no hub in" in out.stderr and "hub.py up" in out.stderr


@root_only
def test_an_account_kept_from_an_earlier_term_gets_its_home_back(tmp_path):
    name = "dtpt-keep"
    accounts.remove_account(name)
    try:
        made = accounts.ensure_account(name, tmp_path)
        shutil.rmtree(made.pw_dir)
        again = accounts.ensure_account(name, tmp_path)
        home = os.stat(again.pw_dir)
        assert (home.st_uid, stat.S_IMODE(home.st_mode)) == (again.pw_uid, 0o700)
    finally:
        accounts.remove_account(name)


@root_only
def test_collect_with_nothing_handed_in_names_every_student(tmp_path):
    ex, private, data = tmp_path / "exchange", tmp_path / "private", tmp_path / "data"
    exchange.prepare(ex)
    got = exchange.collect(A, ex, private, data, ["daemon", "nobody"])
    assert got.collected.get(A, []) == [] and got.refused == {}
    assert got.collected.missing[A] == {"daemon": "no submission", "nobody": "no submission"}
