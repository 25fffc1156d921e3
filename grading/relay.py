"""The grader's side of a kernel's sockets, run as part of the kernel (issue 51).

A kernel can make the grader hold gigabytes, or spend minutes of CPU, with messages the
grader's own ZeroMQ sockets cannot refuse: one message of many frames (``ZMQ_MAXMSGSIZE``
bounds a frame), a queue of large messages (a receive queue counts messages, not bytes), a
stream of messages each under every limit. So a sandboxed kernel never talks to the grader
directly. This relay, a small process started in the kernel's own cgroups (its memory and CPU
are the kernel's budget), connects to the kernel's sockets, serves the grader's, and forwards
from the kernel only what the grader will read:

* a message of at most ``max_bytes`` in all, ``MAX_FRAMES`` frames and ``max_items`` JSON
  items (counted on its raw bytes, never parsed);
* on shell and control: one reply to each request of the grader's, nothing unasked; nothing on
  stdin (grading never asks for input);
* on iopub: only messages about a request of the grader's (and the kernel's welcome), at most
  ``MAX_STATUS`` status messages each, and output up to ``cell_bytes`` per request and
  ``notebook_bytes`` per kernel (a message carrying a test's submission counts in its cell's
  budget only), of the types a notebook keeps; widget traffic is not forwarded;
* towards the grader, one message waits per channel: a grader that reads slowly makes the
  relay read slowly (the kernel's sends wait, or fill its own queues).

A dropped reply is replaced by a small error reply, and the first output a budget drops in a
cell by one line of stderr saying what the grader dropped and why (``metadata`` key
``course_relay``, which :class:`grading.preprocessors.RecoveringExecute` reports as a limit),
both signed with the kernel's key. The relay starts the sandbox (``bwrap``) as its child, with
stdin and stdout ``/dev/null`` and stderr a pipe it keeps 4 KiB of (printed if the kernel fails
to start), and ends with it. It reaches the kernel's sockets through file descriptors opened
once, with no link followed: a kernel that replaces a socket file with a link to a host socket
is never followed there.

Run by :class:`grading.sandbox.SandboxedKernelManager` as
``python -I relay.py GRADER.json KERNEL.json LIMITS.json -- bwrap ...``: only the standard
library and pyzmq.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import resource
import secrets
import stat
import subprocess
import sys
import time
import uuid
from datetime import datetime, timezone

import zmq

CHANNELS = ("shell", "control", "stdin", "iopub", "hb")
DELIM = b"<IDS|MSG>"
MAX_FRAMES = 32            # after the delimiter: signature, 4 parts and buffers
MAX_HEADER = 64 * 1024     # a header or parent header (parsed here)
MAX_SMALL = 4 * 1024       # a status, a welcome
MAX_STATUS = 8             # status messages per request (an honest kernel sends 2)
MAX_UNPARENTED = 32        # welcome and "starting" messages per kernel
MAX_HB = 1024              # a heartbeat's echo
MIN_KEPT = 4096            # the least of a long print worth keeping, cut, before the note
KEPT_STDERR = 4096
OUTPUT = {"stream", "display_data", "execute_result", "update_display_data", "error",
          "clear_output", "execute_input"}
HWM = 2                    # messages queued towards the grader
RELAY_NOTE = "course_relay"  # the metadata key of the relay's own notices


def items(frames: list[bytes]) -> int:
    """JSON items in ``frames``, counted on the bytes (an over-count, never an under-count)."""
    return sum(f.count(b",") + f.count(b"[") + f.count(b"{") for f in frames)


def _loads(frame: bytes, limit: int) -> dict | None:
    if len(frame) > limit:
        return None
    try:
        value = json.loads(frame)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


class Relay:
    """One kernel's relay (see the module doc)."""

    def __init__(self, grader: dict, kernel: dict, limits: dict):
        self.key = grader.get("key", "").encode()
        self.digest = getattr(hashlib, grader.get("signature_scheme", "hmac-sha256")
                              .partition("-")[2] or "sha256")
        self.max_bytes = int(limits["max_bytes"])
        self.max_items = int(limits["max_items"])
        self.cell_bytes = int(limits["cell_bytes"])
        self.notebook_bytes = int(limits["notebook_bytes"])
        self.submit_mark = limits.get("submit_mime", "").encode() or None
        self.ctx = zmq.Context()
        self.front, self.back, self.fds = {}, {}, []
        kinds = {"shell": (zmq.ROUTER, zmq.DEALER), "control": (zmq.ROUTER, zmq.DEALER),
                 "stdin": (zmq.ROUTER, zmq.DEALER), "iopub": (zmq.XPUB, zmq.XSUB),
                 "hb": (zmq.ROUTER, zmq.DEALER)}
        ident = uuid.uuid4().hex.encode()
        for name, (front_kind, back_kind) in kinds.items():
            front = self.ctx.socket(front_kind)
            front.linger = 0
            front.sndhwm = HWM
            if front_kind == zmq.ROUTER:
                front.setsockopt(zmq.ROUTER_MANDATORY, 1)
            else:
                front.setsockopt(zmq.XPUB_NODROP, 1)
            front.bind(f"ipc://{grader['ip']}-{grader[name + '_port']}")
            back = self.ctx.socket(back_kind)
            back.linger = 0
            back.rcvhwm = HWM
            if back_kind == zmq.DEALER:  # (shell and stdin share one identity, as a client's)
                back.setsockopt(zmq.ROUTING_ID, ident)
            self.front[name], self.back[name] = front, back
        self.kernel = kernel
        self.pending: dict[tuple[str, str], list[bytes] | None] = {
            (side, c): None for side in ("front", "back") for c in CHANNELS}
        self.requests: dict[str, tuple[str, list[bytes], str]] = {}  # msg_id: channel, idents, type
        self.known: dict[str, None] = {}   # every request's msg_id (insertion-ordered, bounded)
        self.last_execute: str | None = None
        self.statuses: dict[str, int] = {}
        self.cell_used: dict[str, int] = {}
        self.noticed: set[tuple[str, str]] = set()
        self.notebook_used = 0
        self.unparented = 0

    # ------------------------------------------------------------------ the kernel's side

    def connect_kernel(self, child: subprocess.Popen, deadline: float) -> bool:
        """Connect to the kernel's five sockets once each exists as a socket (no link
        followed); False if the kernel ended or did not bind them in time."""
        for name in CHANNELS:
            path = f"{self.kernel['ip']}-{self.kernel[name + '_port']}"
            while True:
                try:
                    fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
                except OSError:
                    fd = None
                if fd is not None:
                    if stat.S_ISSOCK(os.fstat(fd).st_mode):
                        break
                    os.close(fd)
                if child.poll() is not None or time.monotonic() > deadline:
                    return False
                time.sleep(0.01)
            self.fds.append(fd)
            # the socket's inode, through this process's descriptor: a path the kernel
            # renames or replaces later is never looked up again (reconnects included)
            self.back[name].connect(f"ipc:///proc/{os.getpid()}/fd/{fd}")
        return True

    # ------------------------------------------------------------------ signing

    def _message(self, msg_type: str, parent: dict, content: dict, metadata: dict) -> list[bytes]:
        header = {"msg_id": uuid.uuid4().hex, "msg_type": msg_type, "username": "grader",
                  "session": "relay", "version": "5.3",
                  "date": datetime.now(timezone.utc).isoformat()}
        return self._signed(header, parent, metadata, content)

    def _signed(self, *message: dict) -> list[bytes]:
        """The wire frames of header, parent, metadata and content, signed with the key."""
        parts = [json.dumps(p).encode() for p in message]
        mac = hmac.new(self.key, digestmod=self.digest)
        for part in parts:
            mac.update(part)
        return [DELIM, mac.hexdigest().encode() if self.key else b"", *parts]

    def _notice(self, parent: dict, why: str) -> list[bytes]:
        text = f"[the grader dropped output of this cell: {why}]\n"
        return [b"stream", *self._message("stream", parent, {"name": "stderr", "text": text},
                                          {RELAY_NOTE: why})]

    # ------------------------------------------------------------------ kernel -> grader

    def _shape(self, frames: list[bytes]) -> tuple[int, list[bytes]] | None:
        try:
            at = frames.index(DELIM)
        except ValueError:
            return None
        return at, frames[at + 1:]

    def _too_big(self, frames: list[bytes], body: list[bytes]) -> tuple[str, str] | None:
        """(kind, why) if the grader cannot read this message, else None."""
        size = sum(len(f) for f in frames)
        if size > self.max_bytes:
            return "size", (f"it sent a message over {self.max_bytes / 2**20:g} MiB "
                            f"({size / 2**20:,.1f} MiB), which the grader could not read")
        if len(body) > MAX_FRAMES:
            return "parts", (f"the grader could not read a message of {len(body):,} parts "
                             f"(at most {MAX_FRAMES})")
        n = items(body[1:5])
        if n > self.max_items:
            return "items", (f"the grader could not read a message of {n:,} items "
                             f"(at most {self.max_items:,})")
        return None

    def from_kernel(self, channel: str, frames: list[bytes]) -> list[bytes] | None:
        """What the grader gets for ``frames`` from the kernel on ``channel`` (None: nothing)."""
        if channel == "hb":
            return frames if sum(len(f) for f in frames) <= MAX_HB else None
        if channel == "stdin":
            return None
        shape = self._shape(frames)
        if shape is None or len(shape[1]) < 5:
            return None
        body = shape[1]
        header, parent = _loads(body[1], MAX_HEADER), _loads(body[2], MAX_HEADER)
        if header is None or parent is None:
            return None
        why = self._too_big(frames, body)
        if channel == "iopub":
            return self._iopub(frames, header, parent, body, why)
        request = self.requests.pop(str(parent.get("msg_id")), None)
        if request is None or request[0] != channel:
            return None  # a reply to nothing the grader asked on this channel
        idents, asked = request[1], request[2]
        if why is None:
            return [*idents, *frames[shape[0]:]]
        reply = asked.replace("_request", "_reply")
        return [*idents, *self._message(reply, parent, {
            "status": "error", "ename": "GradingLimit", "evalue": f"the kernel's reply was "
            f"dropped: {why[1]}", "traceback": [], "execution_count": None}, {})]

    def _iopub(self, frames, header, parent, body, why) -> list[bytes] | None:
        kind = str(header.get("msg_type"))
        pid = parent.get("msg_id")
        if not pid:
            self.unparented += 1
            small = sum(len(f) for f in frames) <= MAX_SMALL
            return frames if (kind in ("iopub_welcome", "status") and small
                              and self.unparented <= MAX_UNPARENTED) else None
        pid = str(pid)
        if pid not in self.known:
            return None  # about nothing the grader asked
        if kind == "status":
            self.statuses[pid] = self.statuses.get(pid, 0) + 1
            small = sum(len(f) for f in frames) <= MAX_SMALL
            return frames if small and self.statuses[pid] <= MAX_STATUS else None
        if kind not in OUTPUT:
            return None  # widget traffic and anything else a notebook does not keep
        size = sum(len(f) for f in frames)
        if why is None:
            used = self.cell_used.get(pid, 0)
            submission = self.submit_mark is not None and self.submit_mark in body[4]
            if used + size > self.cell_bytes:
                why = "cell", f"more than {self.cell_bytes / 1e6:g} MB of output in one cell"
            elif not submission and self.notebook_used + size > self.notebook_bytes:
                why = "notebook", (f"more than {self.notebook_bytes / 1e6:g} MB of output in "
                                   f"the notebook")
            else:
                self.cell_used[pid] = used + size
                self.notebook_used += 0 if submission else size
                return frames
        if (pid, why[0]) in self.noticed:
            return None
        self.noticed.add((pid, why[0]))
        room = min(self.cell_bytes - self.cell_used.get(pid, 0),
                   self.notebook_bytes - self.notebook_used)
        if kind == "stream" and why[0] in ("cell", "notebook", "size") and room > MIN_KEPT:
            cut = self._cut_stream(parent, header, body, room, why[1])
            if cut is not None:  # (the budget's worth of a long print, then the note)
                self.cell_used[pid] = self.cell_bytes
                self.notebook_used += room
                return [frames[0], *cut]
        return self._notice(parent, why[1])

    def _cut_stream(self, parent, header, body, room: int, why: str) -> list[bytes] | None:
        """A stream message cut to ``room`` bytes of text and a line saying so, signed anew
        (its content parsed here, in the kernel's budget); None if it is not one."""
        content = _loads(body[4], self.max_bytes)
        text = content.get("text") if content else None
        if not isinstance(text, str) or not isinstance(content.get("name"), str):
            return None
        keep = text[:room // 2]  # (a character may take two bytes as JSON)
        note = (f"\n[... {len(text) - len(keep):,} more characters cut by the grader: "
                f"{why}]\n")
        return self._signed(header, parent, {RELAY_NOTE: why},
                            {"name": content["name"], "text": keep + note})

    # ------------------------------------------------------------------ grader -> kernel

    def from_grader(self, channel: str, frames: list[bytes]) -> list[bytes]:
        """Note the request (its reply and its outputs may come back), forward it as it is."""
        if channel in ("shell", "control"):
            shape = self._shape(frames)
            header = _loads(shape[1][1], MAX_HEADER) if shape and len(shape[1]) > 1 else None
            if header is not None and header.get("msg_id"):
                msg_id = str(header["msg_id"])
                self.requests[msg_id] = (channel, frames[:shape[0]],
                                         str(header.get("msg_type", "")))
                self.known[msg_id] = None
                while len(self.known) > 4096:
                    stale = next(iter(self.known))
                    del self.known[stale]
                    self.requests.pop(stale, None)
                if header.get("msg_type") == "execute_request":
                    self.last_execute = msg_id
        return frames

    # ------------------------------------------------------------------ the loop

    def run(self, child: subprocess.Popen, err_fd: int | None) -> int:
        """Relay until the sandbox ends; its exit code. A channel reads from one side only
        while nothing of that side waits to be sent to the other."""
        kept = bytearray()
        while True:
            poller = zmq.Poller()
            for name in CHANNELS:
                for side, other in (("front", "back"), ("back", "front")):
                    want = zmq.POLLIN if self.pending[(side, name)] is None else 0
                    want |= zmq.POLLOUT if self.pending[(other, name)] is not None else 0
                    if want:
                        poller.register(self._socket(side, name), want)
            if err_fd is not None:
                poller.register(err_fd, zmq.POLLIN)
            events = dict(poller.poll(100))
            if err_fd is not None and events.get(err_fd):
                chunk = _read(err_fd)
                if chunk == b"":
                    os.close(err_fd)
                    err_fd = None
                elif chunk and len(kept) < KEPT_STDERR:
                    kept += chunk[:KEPT_STDERR - len(kept)]
            for name in CHANNELS:
                for side, other in (("front", "back"), ("back", "front")):
                    sock = self._socket(side, name)
                    flags = events.get(sock, 0)
                    if flags & zmq.POLLOUT and self.pending[(other, name)] is not None:
                        try:
                            sock.send_multipart(self.pending[(other, name)], zmq.NOBLOCK)
                            self.pending[(other, name)] = None
                        except zmq.Again:
                            pass
                        except zmq.ZMQError:  # (an identity that is not there: dropped)
                            self.pending[(other, name)] = None
                    if flags & zmq.POLLIN and self.pending[(side, name)] is None:
                        frames = sock.recv_multipart(zmq.NOBLOCK)
                        self.pending[(side, name)] = (self.from_grader(name, frames)
                                                      if side == "front"
                                                      else self.from_kernel(name, frames))
            code = child.poll()
            if code is not None:
                if code != 0 and kept:
                    sys.stderr.write(kept.decode("utf-8", "replace"))
                return code

    def _socket(self, side: str, name: str) -> zmq.Socket:
        return (self.front if side == "front" else self.back)[name]


def _read(fd: int) -> bytes | None:
    """What a non-blocking pipe holds (b"": it was closed; None: nothing yet)."""
    try:
        return os.read(fd, 65536)
    except BlockingIOError:
        return None


# ------------------------------------------------------------------ the grader's own sockets
# (behind the relay, a second layer: used by grading.sandbox in the grader's process)


def bound_sockets(context: zmq.Context, max_message_mb: float) -> None:
    """Every socket ``context`` makes refuses a frame over ``max_message_mb`` and queues at
    most ``RECEIVE_QUEUE`` messages (the relay sends no message over the limit, whatever its
    frames)."""
    context.setsockopt(zmq.MAXMSGSIZE, int(max_message_mb * 2**20))
    context.setsockopt(zmq.RCVHWM, RECEIVE_QUEUE)


RECEIVE_QUEUE = 2


class MessageTooComplex(ValueError):
    """A kernel's message holds more items than the grader parses (:func:`guarded_unpack`)."""


def guarded_unpack(unpack, max_items: int):
    """``unpack`` (the session's JSON parser) refusing a message with more than ``max_items``
    items before parsing it: a parsed item costs the grader 10-70 bytes (measured: 28 MiB of
    empty lists parse into 704 MB, of two-letter strings into 434 MB), so one message under the
    size limit could otherwise take gigabytes. Items are counted from the raw bytes (commas and
    brackets, those inside strings too: an over-count, never an under-count)."""
    def guarded(data):
        raw = data.tobytes() if isinstance(data, memoryview) else data
        if isinstance(raw, bytes):
            n = items([raw])
            if n > max_items:
                raise MessageTooComplex(f"a message of {n:,} items (at most {max_items:,})")
        return unpack(data)

    guarded.course_guarded = True
    return guarded


def main(argv: list[str]) -> int:
    grader_file, kernel_file, limits_file, sep, *cmd = argv
    assert sep == "--" and cmd, "usage: relay.py GRADER KERNEL LIMITS -- command..."
    grader = json.loads(open(grader_file).read())
    limits = json.loads(open(limits_file).read())
    if limits.get("memory_bytes"):  # (a machine without a memory cgroup: the relay's own cap)
        cap = int(limits["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    # the kernel's own connection: fresh socket names in its folder, the grader's key
    kernel = dict(grader, transport="ipc",
                  ip=os.path.join(limits["kernel_sockets"], f"k-{secrets.token_hex(6)}"))
    fd = os.open(kernel_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "w") as f:
        json.dump(kernel, f)
    os.chmod(kernel_file, 0o644)
    relay = Relay(grader, kernel, limits)
    read_err, write_err = os.pipe()
    child = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=write_err)
    os.close(write_err)
    os.set_blocking(read_err, False)
    if not relay.connect_kernel(child, time.monotonic() + float(limits.get("start_s", 120))):
        child.kill()
        child.wait()
        sys.stderr.write((_read(read_err) or b"")[:KEPT_STDERR].decode("utf-8", "replace"))
        return 1
    return relay.run(child, read_err)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
