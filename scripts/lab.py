#!/usr/bin/env python
"""Start JupyterLab on the student's workspace and print one line: the URL to open.

    python scripts/lab.py            # what `make lab` runs, after scripts/workspace.py
    python scripts/lab.py --identity alice   # record the identity your numbers are drawn for

JupyterLab's own log (about 60 lines, the URL among them) goes to ``workspace/.jupyter-lab.log``;
the terminal shows how long start-up took and the URL. Ctrl-C stops the server. The student's
configuration: ``jupyter/student`` (no instructor menus, no Validate button, no formgrader
server extension) and ``workspace/.ipython`` (course_utils' notebook messages from the first
cell on, after a kernel restart too).
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
WORKSPACE = ROOT / "workspace"
sys.path.insert(0, str(ROOT))


def server_url(runtime: Path, pid: int) -> str | None:
    """The URL (with its token) of the server ``pid``, from its runtime file, once written."""
    info = runtime / f"jpserver-{pid}.json"
    try:
        data = json.loads(info.read_text())
    except (OSError, ValueError):
        return None
    return f"{data['url'].rstrip('/')}/lab?token={data.get('token', '')}"


def record_identity(given: str | None = None, ask=input, interactive: bool | None = None) -> str:
    """The identity the assignments draw the student's own numbers from (issue 26), recorded
    once in ``workspace/.course/identity`` (``course_utils.variants``): ``given`` (``--identity
    NAME``), else asked the first time in a terminal. An empty answer records the base numbers.
    A hub's user or ``COURSE_STUDENT`` wins over the file. Returns the line to print."""
    from course_utils import variants

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
    env = dict(os.environ, JUPYTER_CONFIG_PATH=str(ROOT / "jupyter" / "student"),
               IPYTHONDIR=str(WORKSPACE / ".ipython"), JUPYTER_RUNTIME_DIR=str(runtime))
    cmd = [sys.executable, "-m", "jupyter", "lab",
           *(["--allow-root"] if os.getuid() == 0 else []), *extra, str(WORKSPACE)]
    t0 = time.monotonic()
    with log.open("w") as out:  # (its own session: Ctrl-C reaches this script, which stops it)
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    print("lab: starting JupyterLab ...", flush=True)
    url = None
    while proc.poll() is None and url is None and time.monotonic() - t0 < 300:
        url = server_url(runtime, proc.pid)
        time.sleep(0.2)
    if url is None:
        proc.terminate()
        print(f"lab: JupyterLab did not start; its log: {log}\n{log.read_text()[-3000:]}",
              file=sys.stderr)
        return 1
    print(f"lab: ready in {time.monotonic() - t0:.0f} s. Open {url}\n"
          f"lab: (log: {log.relative_to(ROOT)}; Ctrl-C stops the server)", flush=True)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        print("lab: stopping JupyterLab ...", flush=True)
        proc.send_signal(signal.SIGTERM)  # (SIGINT would ask for a confirmation nobody sees)
        try:
            return proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.wait()


if __name__ == "__main__":
    sys.exit(main())
