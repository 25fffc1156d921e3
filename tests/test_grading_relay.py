"""The kernel's relay (``grading.relay``, issue 51): what it forwards to the grader, at the
value level, and that it reaches the kernel's sockets by descriptor, never by a path. The
relay in a real class run (messages of 64 frames of 30 MiB, 60 queued messages, floods):
``tests/test_grading_host.py``."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

import pytest
from jupyter_client.session import Session

from grading import relay

KEY = uuid.uuid4().hex
LIMITS = {"max_bytes": 1_000_000, "max_items": 10_000, "cell_bytes": 50_000,
          "notebook_bytes": 120_000, "submit_mime": "application/vnd.course.submission+json"}


@pytest.fixture
def pair(tmp_path):
    """A relay bound in ``tmp_path`` (nothing connected) and a session with the kernel's key."""
    ports = {f"{c}_port": 10 + i for i, c in enumerate(relay.CHANNELS)}
    grader = {"key": KEY, "signature_scheme": "hmac-sha256", "ip": str(tmp_path / "g"),
              "transport": "ipc", **ports}
    r = relay.Relay(grader, dict(grader, ip=str(tmp_path / "k")), LIMITS)
    yield r, Session(key=KEY.encode(), signature_scheme="hmac-sha256")
    r.ctx.destroy(linger=0)


def _request(session, msg_type="execute_request"):
    msg = session.msg(msg_type, {})
    return msg, [b"grader-id", *session.serialize(msg)]


def _from_kernel(session, kind, parent, content, topic=b"iopub", buffers=()):
    msg = session.msg(kind, content, parent=parent)
    return [topic, *session.serialize(msg), *buffers]


def _read(session, frames):
    """The message the grader gets (signature checked, as jupyter_client checks it)."""
    _, parts = session.feed_identities(frames, copy=True)
    return session.deserialize(parts, content=True)


def test_outputs_pass_within_their_budgets_then_one_notice_says_why(pair):
    r, s = pair
    asked, frames = _request(s)
    assert r.from_grader("shell", frames) is frames
    out = _from_kernel(s, "stream", asked, {"name": "stdout", "text": "x" * 20_000})
    assert r.from_kernel("iopub", out) is out
    assert r.from_kernel("iopub", out) is out
    notice = r.from_kernel("iopub", out)  # the third: over the cell's 50,000 bytes
    got = _read(s, notice)
    assert got["msg_type"] == "stream" and got["parent_header"]["msg_id"] == asked["msg_id"]
    assert got["metadata"][relay.RELAY_NOTE] == "more than 0.05 MB of output in one cell"
    # (a long print keeps what fits in the budget, then says how much the grader cut)
    text = got["content"]["text"]
    assert text.startswith("x" * 4000) and "more characters cut by the grader" in text
    assert len(text) < 10_000
    assert r.from_kernel("iopub", out) is None  # (one notice per cell and reason)
    status = _from_kernel(s, "status", asked, {"execution_state": "idle"})
    assert r.from_kernel("iopub", status) is status  # a cell still ends
    # the notebook's budget: other cells' output stops at 120,000 bytes, but a test's
    # submission (its own cell's budget only) still reaches the judge
    sums = []
    for _ in range(4):
        asked, frames = _request(s)
        r.from_grader("shell", frames)
        sums.append(r.from_kernel("iopub", _from_kernel(s, "stream", asked, {
            "name": "stdout", "text": "y" * 30_000})))
    assert sums[0] is not None and relay.RELAY_NOTE in _read(s, sums[-1])["metadata"]
    submit = _from_kernel(s, "display_data", asked, {"data": {LIMITS["submit_mime"]: {}},
                                                     "metadata": {}})
    assert r.from_kernel("iopub", submit) is submit


@pytest.mark.parametrize("shape", ["bytes", "frames", "items"])
def test_a_message_the_grader_cannot_read_becomes_a_notice(pair, shape):
    r, s = pair
    asked, frames = _request(s)
    r.from_grader("shell", frames)
    content, buffers = {"name": "stdout", "text": "z"}, ()
    if shape == "bytes":
        buffers = [b"x" * 600_000] * 2
    elif shape == "frames":
        buffers = [b"x"] * 40
    else:
        content = {"data": {"application/json": [[]] * 12_000}, "metadata": {}}
    out = _from_kernel(s, "display_data", asked, content, buffers=buffers)
    note = _read(s, r.from_kernel("iopub", out))["metadata"][relay.RELAY_NOTE]
    assert {"bytes": "over 0.953674 MiB", "frames": "45 parts",
            "items": "items (at most 10,000)"}[shape] in note, note


def test_only_asked_replies_and_messages_about_requests_reach_the_grader(pair):
    r, s = pair
    asked, frames = _request(s, "kernel_info_request")
    r.from_grader("shell", frames)
    reply = s.msg("kernel_info_reply", {"status": "ok"}, parent=asked)
    wire = [b"kernel-sent-this-id", *s.serialize(reply)]
    assert r.from_kernel("shell", wire)[0] == b"grader-id"  # (the grader's own identity)
    assert r.from_kernel("shell", wire) is None   # one reply per request
    assert r.from_kernel("control", wire) is None  # and on its own channel
    stranger = s.msg("stream", {"name": "stdout", "text": "x"}, parent=s.msg("x", {}))
    assert r.from_kernel("iopub", [b"x", *s.serialize(stranger)]) is None
    assert r.from_kernel("iopub", _from_kernel(s, "comm_msg", asked, {"data": {}})) is None
    assert r.from_kernel("stdin", wire) is None
    statuses = [r.from_kernel("iopub", _from_kernel(s, "status", asked,
                                                    {"execution_state": "busy"}))
                for _ in range(relay.MAX_STATUS + 3)]
    assert statuses.count(None) == 3
    welcome = _from_kernel(s, "iopub_welcome", {}, {"subscription": ""})
    passed = [r.from_kernel("iopub", welcome) for _ in range(relay.MAX_UNPARENTED + 5)]
    assert passed.count(None) == 5
    assert r.from_kernel("hb", [b"ping"]) == [b"ping"]
    assert r.from_kernel("hb", [b"x" * 5000]) is None


def test_a_reply_too_big_to_read_becomes_an_error_reply(pair):
    r, s = pair
    asked, frames = _request(s)
    r.from_grader("shell", frames)
    reply = s.msg("execute_reply", {"status": "ok", "pad": "x" * 2_000_000}, parent=asked)
    got = _read(s, r.from_kernel("shell", [b"id", *s.serialize(reply)]))
    assert got["msg_type"] == "execute_reply"
    assert got["content"]["status"] == "error" and got["content"]["ename"] == "GradingLimit"
    assert got["parent_header"]["msg_id"] == asked["msg_id"]


def test_the_kernels_sockets_are_reached_by_descriptor_never_by_a_link(pair, tmp_path):
    """A socket path that is a link (a kernel can replace its socket files with links to any
    socket of the host) is never connected to; a real socket is, through /proc/<pid>/fd."""
    r, _ = pair
    host = socket.socket(socket.AF_UNIX)
    host.bind(str(tmp_path / "host.sock"))
    host.listen()
    for name in relay.CHANNELS:
        os.symlink(tmp_path / "host.sock", f"{r.kernel['ip']}-{r.kernel[name + '_port']}")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        start = time.monotonic()
        assert r.connect_kernel(child, time.monotonic() + 0.5) is False
        assert time.monotonic() - start < 5
        host.settimeout(0.2)
        with pytest.raises(socket.timeout):
            host.accept()  # (nothing connected to the host's socket)
        for name in relay.CHANNELS:  # real sockets in their place
            path = f"{r.kernel['ip']}-{r.kernel[name + '_port']}"
            os.unlink(path)
            socket.socket(socket.AF_UNIX).bind(path)
        assert r.connect_kernel(child, time.monotonic() + 5) is True
        assert all(os.readlink(f"/proc/self/fd/{fd}").endswith(f"-{r.kernel[n + '_port']}")
                   for fd, n in zip(r.fds, relay.CHANNELS))
    finally:
        child.kill()
        child.wait()
        host.close()


def test_the_relay_is_only_the_standard_library_and_pyzmq():
    """It starts in every kernel's budget: no import of the course, jupyter_client or torch."""
    out = subprocess.run([sys.executable, "-I", "-X", "importtime", relay.__file__],
                         capture_output=True, text=True)
    heavy = {line.split("|")[-1].strip().split(".")[0] for line in out.stderr.splitlines()
             if "|" in line} & {"grading", "course_utils", "jupyter_client", "torch", "numpy"}
    assert heavy == set(), heavy
