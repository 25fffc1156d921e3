"""Files the grader writes and reads, safely where a student may have put something.

* :func:`write_private`: every file the grader writes (judge logs, digests, reports, reference
  runs, the files a sandboxed kernel reads) goes through a new temporary file made with
  ``O_EXCL`` in the target's folder, then ``os.replace``: a link or a named pipe that stands at
  the target's name is replaced, never followed or opened.
* :func:`read_regular`: open with ``O_NOFOLLOW | O_NONBLOCK``, check with ``fstat`` that it is a
  regular file no larger than a limit, then read: a link, a named pipe, a device or an oversized
  (or sparse) file is refused with :class:`NotRegular` saying which.
* :func:`entry_kind`: what an entry is, from ``lstat`` (no link is followed).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from pathlib import Path


class NotRegular(OSError):
    """A path that the grader refuses to read: not a regular file, or too large."""


def write_private(path: Path, data: str | bytes, mode: int = 0o600) -> Path:
    """Write ``data`` at ``path`` atomically (temporary file with ``O_EXCL``, then rename)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def entry_kind(path: Path) -> str:
    """``"file"``, ``"dir"``, ``"link"``, ``"fifo"``, ``"socket"``, ``"device"`` or
    ``"missing"``, from ``lstat`` (a link is a link, whatever it points to)."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(mode):
        return "link"
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def read_regular(path: Path, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most ``max_bytes`` bytes (see the module doc)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        if entry_kind(path) == "link":
            raise NotRegular(f"{path.name} is a symbolic link") from None
        raise err
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            raise NotRegular(f"{path.name} is not a regular file ({entry_kind(path)})")
        if st.st_size > max_bytes:
            raise NotRegular(f"{path.name} is {st.st_size:,} bytes, more than the "
                             f"{max_bytes:,} allowed")
        data = f.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise NotRegular(f"{path.name} grew past {max_bytes:,} bytes while being read")
    return data


__all__ = ["NotRegular", "entry_kind", "read_regular", "write_private"]
