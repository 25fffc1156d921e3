#!/usr/bin/env python
"""Start JupyterLab on the student's workspace and print one line: the URL to open.

    python scripts/lab.py            # what `make lab` runs, after scripts/workspace.py
    python scripts/lab.py --identity alice   # record the identity your numbers are drawn for

JupyterLab's own log (about 60 lines, the URL among them) goes to ``workspace/.jupyter-lab.log``;
the terminal shows how long start-up took and the URL (the first time, the URL opens
``START_HERE.md``). The student's configuration: ``jupyter/student`` (no instructor menus, no
Validate button, no formgrader server extension, no news pop-up, Markdown opened as a page,
kernels idle for 30 minutes shut down) and ``workspace/.ipython`` (course_utils' notebook
messages from the first cell on, after a kernel restart too).

Every way of stopping it stops JupyterLab and its kernels, and leaves no process behind: Ctrl-C
(SIGINT), SIGTERM, a closed terminal's SIGHUP, and the end of the process that started this
script (``make``, killed: Linux tells this script, ``PR_SET_PDEATHSIG``). JupyterLab runs in a
session of its own (so that Ctrl-C reaches this script alone, which then asks it to stop with
SIGTERM, its graceful stop that shuts its kernels down); whatever of it is still running after
that is killed (:func:`stop`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# (COURSE_WORKSPACE: another workspace folder, for tests)
WORKSPACE = Path(os.environ.get("COURSE_WORKSPACE") or ROOT / "workspace")
sys.path.insert(0, str(ROOT))
START_PAGE = "START_HERE.md"
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(Exception):
    """A signal asked ``make lab`` to stop."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_stopped(signum: int, frame) -> None:
    raise Stopped(signum)


def die_with_parent(sig: int = signal.SIGTERM) -> None:
    """Linux: have the kernel send this process ``sig`` when its parent dies (``make`` killed
    while this script runs under it); elsewhere nothing."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        parent = os.getppid()
        libc.prctl(1, int(sig), 0, 0, 0)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # (the parent died before the call)
            os.kill(os.getpid(), sig)
    except (OSError, AttributeError):
        pass


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> int:
    """Stop JupyterLab ``proc`` and everything it started: SIGTERM (it shuts its kernels down),
    then, after ``grace_s``, SIGKILL; any process of it left (a kernel, a kernel's rank
    forkserver: they run in sessions of their own) is killed. Returns its exit code."""
    import psutil

    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        family = []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)  # (SIGINT would ask for a confirmation nobody sees)
    try:
        code = proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    try:  # (children the kernels started after the list was taken)
        family += [c for p in family for c in p.children(recursive=True)]
    except psutil.Error:
        pass
    _, alive = psutil.wait_procs(family, timeout=5)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
    return code


def server_url(runtime: Path, pid: int, page: str = "lab") -> str | None:
    """The URL (with its token) of ``page`` on the server ``pid``, from its runtime file, once
    written."""
    info = runtime / f"jpserver-{pid}.json"
    try:
        data = json.loads(info.read_text())
    except (OSError, ValueError):
        return None
    return f"{data['url'].rstrip('/')}/{page}?token={data.get('token', '')}"


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


def record_identity(given: str | None = None, ask=input, interactive: bool | None = None) -> str:
    """The identity the assignments draw the student's own numbers from (issue 26), recorded
    once in ``workspace/.course/identity`` (``course_utils.assess.variants``): ``given`` (``--identity
    NAME``), else asked the first time in a terminal. An empty answer records the base numbers.
    A hub's user or ``COURSE_STUDENT`` wins over the file. Returns the line to print."""
    from course_utils.assess import variants

    path = Path(os.environ.get(variants.IDENTITY_FILE_ENV) or WORKSPACE / ".course" / "identity")
    for var in (variants.IDENTITY_ENV, variants.HUB_ENV):
        if os.environ.get(var):
            return f"lab: your numbers are drawn for {os.environ[var]} (${var})"
    if given is None and path.exists():
        who = path.read_text(encoding="utf-8").strip()
        return (f"lab: your numbers are drawn for {who}" if who else
                "lab: no identity: the assignments show the base numbers") + \
            f" (kept in {path}; delete it to be asked again)"
    if given is None:
        if not (sys.stdin.isatty() if interactive is None else interactive):
            return ("lab: no identity set: the assignments show the base numbers (run "
                    "`python scripts/lab.py --identity YOUR_ID` to get your own)")
        while True:
            given = ask("lab: your student id, as your instructor knows you (the assignments "
                        "draw your own numbers from it; Enter for the base numbers): ").strip()
            try:
                if given:
                    variants.check_identity(given, "your student id")
                break
            except ValueError as err:
                print(f"lab: {err}")
    elif given:
        variants.check_identity(given, "--identity")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(given + "\n", encoding="utf-8")
    return (f"lab: your numbers are drawn for {given}" if given else
            "lab: no identity: the assignments show the base numbers") + \
        f" (kept in {path}; delete it to be asked again)"


def main(argv: list[str] | None = None) -> int:
    extra = list(argv if argv is not None else sys.argv[1:])
    given = None
    if "--identity" in extra:
        at = extra.index("--identity")
        if at + 1 >= len(extra):
            print("lab: --identity needs a value (your student id)", file=sys.stderr)
            return 2
        given = extra[at + 1]
        del extra[at:at + 2]
    try:
        print(record_identity(given), flush=True)
    except ValueError as err:
        print(f"lab: {err}", file=sys.stderr)
        return 2
    log = WORKSPACE / ".jupyter-lab.log"
    runtime = WORKSPACE / ".jupyter-runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    opened = WORKSPACE / ".course" / "lab-opened"  # (the first launch opens START_HERE.md)
    page = "lab" if opened.exists() or not (WORKSPACE / START_PAGE).exists() \
        else f"lab/tree/{START_PAGE}"
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(ROOT / "jupyter" / "student"),
               IPYTHONDIR=str(WORKSPACE / ".ipython"), JUPYTER_RUNTIME_DIR=str(runtime))
    cmd = [sys.executable, "-m", "jupyter", "lab", f"--ServerApp.default_url=/{page}",
           *(["--allow-root"] if os.getuid() == 0 else []), *extra, str(WORKSPACE)]
    for sig in STOP_SIGNALS:
        signal.signal(sig, _raise_stopped)
    die_with_parent()
    proc = None
    try:
        t0 = time.monotonic()
        with log.open("w") as out:  # (its own session: Ctrl-C reaches this script, which stops it)
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        print("lab: starting JupyterLab ...", flush=True)
        url = None
        while proc.poll() is None and url is None and time.monotonic() - t0 < 300:
            url = server_url(runtime, proc.pid, page)
            time.sleep(0.2)
        if url is None:
            stop(proc)
            print(f"lab: JupyterLab did not start; its log: {log}\n{log.read_text()[-3000:]}",
                  file=sys.stderr)
            return 1
        opened.parent.mkdir(parents=True, exist_ok=True)
        opened.touch()
        print(f"lab: ready in {time.monotonic() - t0:.0f} s. Open {url}\n"
              f"lab: (log: {_shown(log)}; Ctrl-C stops the server and its kernels)", flush=True)
        return proc.wait()
    except (Stopped, KeyboardInterrupt) as why:
        name = why.args[0] if isinstance(why, Stopped) else "SIGINT"
        for sig in STOP_SIGNALS:  # (a second signal while stopping: finish stopping)
            signal.signal(sig, signal.SIG_IGN)
        if proc is None:
            return 128 + (why.signum if isinstance(why, Stopped) else signal.SIGINT)
        _say(f"lab: {name}: stopping JupyterLab and its kernels ...")
        started = time.monotonic()
        code = stop(proc)
        _say(f"lab: stopped in {time.monotonic() - started:.1f} s: no JupyterLab server or "
             f"kernel of this session is left running; `make lab` starts it again")
        return code


def _say(line: str) -> None:
    """Print ``line`` if the terminal is still there (a closed one: nothing)."""
    try:
        print(line, flush=True)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main())
