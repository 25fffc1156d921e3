"""The class's accounts: one Unix user per roster student, and their first passwords.

Every student of ``$COURSE_DATA/roster.csv`` gets a Unix account of the same name (the hub user,
nbgrader's student id and the grader's ``COURSE_STUDENT`` are that one name), in the group
:data:`GROUP`, with a home of their own (mode 0700) under the class's homes folder. An id that
names an account the course did not make (``root``, ``daemon``, an instructor's own) is refused:
the hub would otherwise start that account's server.

First passwords: each account gets a random one before the hub starts, stored (bcrypt) where the
hub's authenticator (FirstUseAuthenticator) keeps its passwords, and written once to the
instructor's handout (``handout.csv``, mode 0600). So no one can claim a classmate's account by
logging in first; the student changes it at ``/hub/auth/change-password``.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import secrets
import subprocess
from pathlib import Path

GROUP = "dtp-students"
# Unix user names useradd takes on every distribution: lower case, digits, _ and -, <= 32.
_UNIX_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
_WORDS = "abcdefghijkmnpqrstuvwxyz23456789"  # (no l, o, 0, 1: read aloud, typed from paper)

__all__ = ["GROUP", "check_unix_name", "is_course_account", "ensure_account", "remove_account",
           "first_password", "new_password", "seed_passwords"]


def check_unix_name(student: str) -> str:
    """``student`` if it can be a Unix account's name; else ValueError naming the rule."""
    if not isinstance(student, str) or not _UNIX_NAME.fullmatch(student):
        raise ValueError(f"roster id {student!r} cannot be a Unix user name on the hub: use 1 to "
                         f"32 lower-case letters, digits, _ or -, starting with a letter or _")
    return student


def is_course_account(student: str) -> bool:
    """Whether ``student`` is an account this course made (its primary group is :data:`GROUP`)."""
    try:
        entry = pwd.getpwnam(student)
        return grp.getgrgid(entry.pw_gid).gr_name == GROUP
    except KeyError:
        return False


def ensure_account(student: str, homes: Path) -> pwd.struct_passwd:
    """The Unix account of ``student`` (made if missing: group :data:`GROUP`, home
    ``homes/<student>`` mode 0700, no login shell password); ValueError if the name belongs to
    an account the course did not make."""
    check_unix_name(student)
    try:
        grp.getgrnam(GROUP)
    except KeyError:
        subprocess.run(["groupadd", "--system", GROUP], check=True, capture_output=True)
    try:
        pwd.getpwnam(student)
    except KeyError:
        home = Path(homes) / student
        subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--gid", GROUP,
                        "--shell", "/bin/bash", "--comment", "dtp course student", student],
                       check=True, capture_output=True, text=True)
    if not is_course_account(student):
        raise ValueError(f"roster id {student!r} is an account of this machine that the course "
                         f"did not make (its group is not {GROUP}); rename the student in the "
                         f"roster")
    entry = pwd.getpwnam(student)
    home = Path(entry.pw_dir)
    if not home.is_dir():  # (an account kept from an earlier term whose home was removed)
        home.mkdir(parents=True)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    os.chmod(home, 0o700)
    return entry


def remove_account(student: str) -> None:
    """Delete a course account and its home (never an account the course did not make)."""
    if is_course_account(student):
        subprocess.run(["userdel", "--remove", student], capture_output=True)


def first_password() -> str:
    """A random first password: 12 characters of :data:`_WORDS` (about 60 bits)."""
    return "".join(secrets.choice(_WORDS) for _ in range(12))


def new_password(who: str, dbm_path: Path) -> str:
    """Give ``who`` a new first password in ``dbm_path`` (FirstUseAuthenticator's store, bcrypt);
    returns it."""
    from firstuseauthenticator import FirstUseAuthenticator

    password = first_password()
    FirstUseAuthenticator(dbm_path=str(dbm_path)).reset_password(who, password)
    return password


def seed_passwords(students: list[str], dbm_path: Path) -> dict[str, str]:
    """Give every student without a password in ``dbm_path`` (FirstUseAuthenticator's store) a
    first one; returns ``{student: password}`` for those given one now (the others keep theirs)."""
    import dbm

    with dbm.open(str(dbm_path), "c", 0o600) as db:
        have = {k.decode() for k in db.keys()}
    return {s: new_password(s, dbm_path) for s in students if s not in have}
