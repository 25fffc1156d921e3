"""A client of a running class hub, as a student's browser or the instructor's shell uses it:
bring one up (:class:`RunningHub`), log in through the real login form, start a server, call
its API, run code in a kernel of it. The hub's tests and ``benchmarks/hub_load.py`` drive it.
"""

from __future__ import annotations

import asyncio
import csv
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HUB = [sys.executable, str(ROOT / "scripts" / "hub.py")]

__all__ = ["free_port", "RunningHub", "login", "open_lab", "xsrf", "server_api", "run_code",
           "run_lecture"]


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the hub's own ports, a test hub's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RunningHub:
    """``scripts/hub.py up`` on 127.0.0.1 with a roster of ``students`` in ``tmp``."""

    def __init__(self, tmp: Path, students: tuple[str, ...], cull_timeout: int = 3600,
                 spawner: str = "local", env: dict[str, str] | None = None):
        self.data, self.state, self.homes = tmp / "data", tmp / "state", tmp / "homes"
        self.data.mkdir()
        rows = "".join(f"{s},{s[5:].title()},Test,{s}@example.org\n" for s in students)
        (self.data / "roster.csv").write_text("id,first_name,last_name,email\n" + rows)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = dict(os.environ, **(env or {}), COURSE_DATA=str(self.data))
        self.spawner = spawner
        self.out = tmp / "hub.out"
        with self.out.open("w") as out:
            self.proc = subprocess.Popen(
                [*HUB, "--state", str(self.state), "up", "--port", str(self.port), "--ip",
                 "127.0.0.1", "--homes", str(self.homes), "--cull-timeout", str(cull_timeout),
                 "--spawner", spawner],
                env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.monotonic()
        while "answers at" not in self.out.read_text():
            if self.proc.poll() is not None or time.monotonic() - t0 > 180:
                raise RuntimeError(f"the hub did not come up:\n{self.out.read_text()}")
            time.sleep(0.3)
        with open(self.state / "private" / "handout.csv") as f:
            self.passwords = {row["id"]: row["first_password"] for row in csv.DictReader(f)}

    def step(self, *args: str) -> str:
        out = subprocess.run([*HUB, "--state", str(self.state), *args], env=self.env,
                             capture_output=True, text=True, timeout=600)
        if out.returncode != 0:
            raise RuntimeError(f"hub.py {' '.join(args)} failed:\n{out.stdout}{out.stderr}")
        return out.stdout

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(120)
        return self.out.read_text()


def login(hub: RunningHub, user: str, password: str | None = None):
    """A requests session logged in through the hub's real login form."""
    import requests

    s = requests.Session()
    page = s.get(f"{hub.url}/hub/login").text
    xsrf = re.search(r'name="_xsrf" value="([^"]+)"', page).group(1)
    r = s.post(f"{hub.url}/hub/login", data={"_xsrf": xsrf, "username": user,
                                              "password": password or hub.passwords[user]})
    s.login_status = r.status_code
    s.user = user
    return s


def open_lab(hub: RunningHub, s) -> None:
    """Start the student's server (the hub's spawn page) and wait for JupyterLab."""
    s.get(f"{hub.url}/hub/spawn")
    t0 = time.monotonic()
    while True:
        r = s.get(f"{hub.url}/user/{s.user}/lab")
        if r.status_code == 200 and r.url.endswith(f"/user/{s.user}/lab"):
            return
        if time.monotonic() - t0 > 120:
            raise RuntimeError(f"{s.user}'s server did not start: {r.status_code} {r.url}")
        time.sleep(1)


def xsrf(s, where: str) -> str:
    """The session's ``_xsrf`` cookie for the path ``where`` (the hub's or a server's)."""
    return [c.value for c in s.cookies if c.name == "_xsrf" and c.path.startswith(where)][0]


def server_api(hub: RunningHub, s, method: str, path: str, **kw):
    """A request to the student's own server, through the hub's proxy."""
    base = f"/user/{s.user}/"
    return s.request(method, f"{hub.url}{base}{path}",
                     headers={"X-XSRFToken": xsrf(s, base)}, **kw)


def run_code(hub: RunningHub, s, code: str, timeout: float = 300) -> tuple[str, str]:
    """(stdout, error) of ``code`` run in a new kernel of the student's own server."""
    from tornado.httpclient import HTTPRequest
    from tornado.websocket import websocket_connect

    kernel = server_api(hub, s, "POST", "api/kernels", json={"name": "python3"}).json()["id"]
    cookie = "; ".join(f"{c.name}={c.value}" for c in s.cookies
                       if c.path.startswith(f"/user/{s.user}") or c.path == "/")
    url = f"ws://127.0.0.1:{hub.port}/user/{s.user}/api/kernels/{kernel}/channels"
    msg_id = uuid.uuid4().hex

    async def go():
        headers = {"Cookie": cookie, "X-XSRFToken": xsrf(s, f"/user/{s.user}/")}
        ws = await websocket_connect(HTTPRequest(url, headers=headers))
        ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "username": s.user,
                       "session": uuid.uuid4().hex, "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}}))
        out, err = [], ""
        while True:
            msg = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            kind = msg["header"]["msg_type"]
            if kind == "stream":
                out.append(msg["content"]["text"])
            elif kind == "error":
                err = f"{msg['content']['ename']}: {msg['content']['evalue']}"
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                ws.close()
                return "".join(out), err

    try:  # (in a thread of its own: a caller's thread may hold an event loop, as Playwright's)
        with ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, go()).result()
    finally:
        server_api(hub, s, "DELETE", f"api/kernels/{kernel}")




def run_lecture(hub: RunningHub, s, lecture: str = "01_training_state",
                timeout: float = 900) -> tuple[bool, float, str]:
    """Run ``lectures/<lecture>.ipynb`` top to bottom in the student's own server (a kernel of
    it runs ``nbconvert --execute``): (whether it finished, its seconds, the last line it wrote
    to stderr, or the kernel's error)."""
    out, err = run_code(hub, s, (
        "import os, subprocess, sys, time\n"
        "t = time.monotonic()\n"
        "r = subprocess.run([sys.executable, '-m', 'nbconvert', '--to', 'notebook', '--execute', "
        f"'--output', '/tmp/lecture.ipynb', 'lectures/{lecture}.ipynb'], capture_output=True, "
        "text=True, cwd=os.path.expanduser('~/workspace'))\n"
        "last = (r.stderr.strip().splitlines() or [''])[-1][-160:]\n"
        "print(r.returncode, round(time.monotonic() - t, 2), last)"), timeout=timeout)
    code, seconds, last = (out.split(maxsplit=2) + ["?", "nan", ""])[:3]
    return code == "0" and not err, float(seconds), (err or last).strip()
